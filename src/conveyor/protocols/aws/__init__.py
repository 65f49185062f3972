"""Pieces shared by the AWS wire protocols (SQS, SNS)."""
