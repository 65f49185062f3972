"""The Amazon SNS wire protocol (JSON and Query) over Conveyor's topics."""
