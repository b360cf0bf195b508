"""The engine side: requests in as token ids and SamplingParams (params.py, the one place
they become GenerationConfig), typed messages out (messages.py), text decoded and cut at
stop strings on the way (text_output.py). The loop is scheduler.py, what it keeps for each
request requests.py, and its output side delivery.py. Knows nothing of HTTP."""

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
from ovtrio.scheduler.scheduler import SHUTTING_DOWN, NotAccepting, Scheduler, SchedulerStats

__all__ = [
    "Completed",
    "Delta",
    "Failed",
    "GenerationRequest",
    "Message",
    "NotAccepting",
    "OutputConstraint",
    "Prompt",
    "RequestStream",
    "SHUTTING_DOWN",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "TaggedRegion",
    "UnsupportedParams",
    "check_params",
]
