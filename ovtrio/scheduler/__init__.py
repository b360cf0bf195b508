"""The engine side: requests in as token ids and SamplingParams (params.py, the one place
they become GenerationConfig), typed messages out (messages.py), text decoded and cut at
stop strings on the way (text_output.py). Knows nothing of HTTP."""

from ovtrio.scheduler.messages import Completed, Delta, Failed, Message, Prompt
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
    "Prompt",
    "RequestStream",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "TaggedRegion",
    "UnsupportedParams",
    "check_params",
]
