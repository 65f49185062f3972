"""SNS errors as AWS returns them.

Each error has a name (the JSON protocol's ``__type``, ``com.amazonaws.sns#<Name>``: the
exception's shape name in the SNS API model), the code the Query protocol (and the JSON
protocol's ``x-amzn-query-error`` header) carries, an HTTP status and a fault side — all
as botocore's SNS model states them. Conveyor's own errors are translated here, in one table.

SNS words most of its client errors as ``Invalid parameter: <Name>`` (optionally followed
by ``Reason: ...``); ``invalid`` builds that.
"""

from __future__ import annotations

from conveyor import errors
from conveyor.protocols.aws.service import COMMON_KINDS, AwsError, Kind, kinds

_KINDS = [
    Kind("InvalidParameterException", "InvalidParameter"),
    Kind("InvalidParameterValueException", "ParameterValueInvalid"),
    Kind("NotFoundException", "NotFound", 404),
    Kind("ResourceNotFoundException", "ResourceNotFound", 404),
    Kind("AuthorizationErrorException", "AuthorizationError", 403),
    Kind("InvalidSecurityException", "InvalidSecurity", 403),
    Kind("TagLimitExceededException", "TagLimitExceeded"),
    Kind("TopicLimitExceededException", "TopicLimitExceeded", 403),
    Kind("SubscriptionLimitExceededException", "SubscriptionLimitExceeded", 403),
    Kind("FilterPolicyLimitExceededException", "FilterPolicyLimitExceeded", 403),
    Kind("BatchEntryIdsNotDistinctException", "BatchEntryIdsNotDistinct"),
    Kind("BatchRequestTooLongException", "BatchRequestTooLong"),
    Kind("EmptyBatchRequestException", "EmptyBatchRequest"),
    Kind("InvalidBatchEntryIdException", "InvalidBatchEntryId"),
    Kind("TooManyEntriesInBatchRequestException", "TooManyEntriesInBatchRequest"),
    Kind("ValidationException", "ValidationException"),
    Kind("ThrottledException", "Throttled", 429),
    Kind("InternalErrorException", "InternalError", 500, sender=False),
]
KINDS = kinds(COMMON_KINDS, _KINDS)

# the wire layer names its errors as SQS does; SNS's codes for them
_WIRE = {"InvalidParameterValue": "InvalidParameterException", "MissingParameter": "InvalidParameterException"}

NO_TOPIC = "Topic does not exist"
NO_SUBSCRIPTION = "Subscription does not exist"
NO_RESOURCE = "Resource does not exist"
INTERNAL = "Internal error, please try again."


class SnsError(AwsError):
    KINDS = KINDS
    ALIASES = _WIRE
    ACCESS_DENIED = "AuthorizationErrorException"


def invalid(parameter: str, reason: str | None = None) -> SnsError:
    """SNS's ``InvalidParameter``: "Invalid parameter: <parameter>[ Reason: <reason>]"."""
    message = f"Invalid parameter: {parameter}" + (f" Reason: {reason}" if reason else "")
    return SnsError("InvalidParameterException", message)


def invalid_value(message: str) -> SnsError:
    """SNS's ``ParameterValueInvalid`` (message attributes)."""
    return SnsError("InvalidParameterValueException", message)


def not_found(message: str = NO_TOPIC) -> SnsError:
    return SnsError("NotFoundException", message)


def from_conveyor(exc: errors.ConveyorError) -> SnsError:
    """Conveyor's error tree in SNS's terms (the few that reach the SNS layer unhandled)."""
    if isinstance(exc, errors.QueueNotFound):
        return invalid("Endpoint", "the queue does not exist")
    if isinstance(exc, errors.NotFound):
        return not_found(NO_TOPIC if "topic" in exc.message.lower() else exc.message)
    if isinstance(exc, (errors.InvalidInput, errors.Conflict)):
        # the topics engine words filter-policy errors as SNS does already
        message = exc.message if exc.message.startswith("Invalid parameter") else f"Invalid parameter: {exc.message}"
        return SnsError("InvalidParameterException", message)
    if isinstance(exc, (errors.PermissionDenied, errors.Unauthorized)):
        return SnsError("AuthorizationErrorException", "You are not authorized to perform this action.")
    if isinstance(exc, errors.Throttled):
        return SnsError("ThrottledException", f"Rate exceeded: {exc.message}")
    if isinstance(exc, errors.Unavailable):
        return SnsError("ServiceUnavailable", "The service is unavailable. Please retry the request.")
    return SnsError("InternalErrorException", INTERNAL)
