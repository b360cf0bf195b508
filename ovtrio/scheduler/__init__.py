"""The engine side: requests in as token ids and SamplingParams (params.py, the one place
they become GenerationConfig), typed messages out (messages.py), text decoded and cut at
stop strings on the way (text_output.py). The loop is scheduler.py, what it keeps for each
request requests.py, and its output side delivery.py. Knows nothing of HTTP."""

from ovtrio.scheduler.admission import AdmissionLimits, Overloaded, RequestTimes
from ovtrio.scheduler.messages import Completed, Delta, Failed, Message, Prompt
from ovtrio.scheduler.params import (
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    TaggedRegion,
    UnsupportedParams,
    check_params,
)
from ovtrio.scheduler.requests import RequestStream
from ovtrio.scheduler.scheduler import Scheduler, SchedulerStats

__all__ = [
    "AdmissionLimits",
    "Completed",
    "Delta",
    "Failed",
    "GenerationRequest",
    "Message",
    "OutputConstraint",
    "Overloaded",
    "Prompt",
    "RequestStream",
    "RequestTimes",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "TaggedRegion",
    "UnsupportedParams",
    "check_params",
]
