"""The engine side: requests in as token ids, typed messages out. Knows nothing of HTTP."""

from ovtrio.scheduler.messages import Completed, Delta, Failed, Message
from ovtrio.scheduler.params import (
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    TaggedRegion,
    UnsupportedParams,
    check_params,
)
from ovtrio.scheduler.scheduler import RequestStream, Scheduler, SchedulerStats

__all__ = [
    "Completed",
    "Delta",
    "Failed",
    "GenerationRequest",
    "Message",
    "OutputConstraint",
    "RequestStream",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "TaggedRegion",
    "UnsupportedParams",
    "check_params",
]
