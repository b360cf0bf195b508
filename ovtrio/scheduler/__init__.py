"""The engine side: requests in as token ids and SamplingParams (params.py, the one place
they become GenerationConfig), typed outputs out (outputs.py), text decoded and cut at
stop strings on the way (text_output.py). Each backend's scheduler is a loop with
collaborators: the requests it takes on (submission, draining, slow readers) are kept
by a RequestIntake (intake.py), which asks the scheduler what its engine has room for
(EngineSide). scheduler.py is the continuous-batching loop; it takes queued requests
into the engine through an EngineAdmission (engine_admission.py) and steps the engine
the ways of stepping.py (engine_step.py and step_thread.py); what it keeps for each
request is in requests.py, what a step's reads hold in reads.py, and its output side in
delivery.py. stateful.py is the other backend's loop, one request at a time on the
stateful LLMPipeline, behind the same interface (interface.py). What a scheduler
reports of each request's life goes to a RequestObserver (observer.py). Knows nothing
of HTTP or of metrics formats."""

from ovtrio.scheduler.admission import AdmissionLimits, Overloaded
from ovtrio.scheduler.intake import SHUTTING_DOWN, NotAccepting
from ovtrio.scheduler.interface import GenerationScheduler, SchedulerStats, added_to, waiting_requests
from ovtrio.scheduler.observer import NoObserver, RequestObserver
from ovtrio.scheduler.outputs import Completed, Delta, Failed, RequestOutput, RequestTimings
from ovtrio.scheduler.params import (
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    SpeculativeDecoding,
    TaggedRegion,
    TextPrompt,
    UnsupportedParams,
    check_params,
    sequences_per_prompt,
)
from ovtrio.scheduler.requests import RequestStream
from ovtrio.scheduler.scheduler import Scheduler
from ovtrio.scheduler.stateful import StatefulScheduler

__all__ = [
    "AdmissionLimits",
    "Completed",
    "Delta",
    "Failed",
    "GenerationRequest",
    "TextPrompt",
    "GenerationScheduler",
    "RequestOutput",
    "RequestTimings",
    "NoObserver",
    "NotAccepting",
    "OutputConstraint",
    "Overloaded",
    "RequestObserver",
    "RequestStream",
    "SHUTTING_DOWN",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "added_to",
    "SpeculativeDecoding",
    "StatefulScheduler",
    "TaggedRegion",
    "UnsupportedParams",
    "check_params",
    "sequences_per_prompt",
    "waiting_requests",
]
