"""SQS errors as AWS returns them.

Each error has a name (the JSON protocol's ``__type``: ``com.amazonaws.sqs#<Name>`` for the
errors SQS's model lists, ``com.amazon.coral.service#<Name>Exception`` for the few it does
not, as AWS answers), the code the Query protocol (and the JSON protocol's
``x-amzn-query-error`` header) carries, an HTTP status and a fault side. Conveyor's own errors are translated here, in one table.
"""

from __future__ import annotations

from conveyor import errors
from conveyor.protocols.aws.service import COMMON_KINDS, AwsError, Kind, kinds

_CORAL = "com.amazon.coral.service#"  # AWS's front end: errors SQS's JSON model does not list

_KINDS = [
    Kind("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
    Kind("QueueNameExists", "QueueAlreadyExists"),
    Kind("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently"),
    Kind("InvalidParameterValue", "InvalidParameterValue", json_type=f"{_CORAL}InvalidParameterValueException"),
    Kind("MissingParameter", "MissingParameter", json_type=f"{_CORAL}MissingRequiredParameterException"),
    Kind("InvalidAttributeName", "InvalidAttributeName"),
    Kind("InvalidAttributeValue", "InvalidAttributeValue"),
    Kind("InvalidMessageContents", "InvalidMessageContents"),
    Kind("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"),
    Kind("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight"),
    Kind("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    Kind("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest"),
    Kind("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    Kind("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId"),
    Kind("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong"),
    Kind("OverLimit", "OverLimit", 403),
    Kind("PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    Kind("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"),
    Kind("ResourceNotFoundException", "ResourceNotFoundException", 404),
    Kind("RequestThrottled", "RequestThrottled"),
    Kind("InternalError", "InternalError", 500, sender=False),
]
KINDS = kinds(COMMON_KINDS, _KINDS)
KINDS["AccessDenied"] = Kind("AccessDenied", "AccessDenied", 403, json_type=f"{_CORAL}AccessDeniedException")

# AWS's wording for the common cases
NO_QUEUE = "The specified queue does not exist."
NO_QUEUE_QUERY = "The specified queue does not exist for this wsdl version."  # the Query protocol's


class SqsError(AwsError):
    KINDS = KINDS


def invalid_value(parameter: str, value: object, reason: str) -> SqsError:
    return SqsError("InvalidParameterValue",
                    f"Value {value} for parameter {parameter} is invalid. Reason: {reason}.")


def missing(parameter: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {parameter}.")


def from_conveyor(exc: errors.ConveyorError) -> SqsError:
    """Conveyor's error tree in SQS's terms (the few that reach the SQS layer unhandled)."""
    if isinstance(exc, errors.QueueNotFound):
        return SqsError("QueueDoesNotExist", NO_QUEUE)
    if isinstance(exc, errors.QueueAlreadyExists):
        return SqsError("QueueNameExists", "A queue already exists with the same name and a different value for an attribute.")
    if isinstance(exc, errors.MessageTooLarge):
        return SqsError("InvalidParameterValue", exc.message)
    if isinstance(exc, errors.InvalidInput):
        return SqsError("InvalidParameterValue", exc.message)
    if isinstance(exc, (errors.PermissionDenied, errors.Unauthorized)):
        return SqsError("AccessDenied", "Access to the resource is denied.")
    if isinstance(exc, errors.Throttled):
        return SqsError("RequestThrottled", f"Request is throttled: {exc.message}")
    if isinstance(exc, errors.Unavailable):
        return SqsError("ServiceUnavailable", "The service is unavailable. Please retry the request.")
    return SqsError("InternalError", "We encountered an internal error. Please try again.")
