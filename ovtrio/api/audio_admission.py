"""Admission of an audio upload before its body is read.

A transcription request's file (up to --audio-max-bytes, 25 MB by default) is read into
memory and decoded before its job can be queued. Checked only then, twenty uploads sent
together would all be read and decoded (over a gigabyte) for most of them to hear the
queue's 429. So each upload takes a place first, from the headers alone: the places of
the transcription models' queues (--audio-max-queued-requests each, and the model's
thread when it computes nothing), less the jobs waiting there and the uploads already
in hand (read, decoded, not yet queued). One
that finds none gets the 429 with Retry-After without its body being read.

The model a request names is in the body, so the places counted are those of every
transcription model served: with one model (the usual case), exactly its queue's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ovtrio.audio.service import TranscriptionService
from ovtrio.scheduler.admission import Overloaded


class UploadAdmission:
    """The uploads of one app in hand: admitted, not yet queued or refused."""

    def __init__(self) -> None:
        self.in_hand = 0

    @contextmanager
    def admitted(self, services: Sequence[TranscriptionService]) -> Iterator[Place]:
        """Hold a place for one upload while it is read and decoded; raises Overloaded
        at once when `services`' queues have none. Its job, queued, takes the place on:
        release it then (Place.queued); leaving the block releases it too."""
        free = sum(service.worker.room() for service in services)
        if free - self.in_hand <= 0:
            waiting = sum(service.stats().queued for service in services) + self.in_hand
            if len(services) == 1:  # the refusal is that model's (its rejected requests)
                raise services[0].worker.refusal(waiting)
            raise Overloaded(
                f"The server has {waiting} requests waiting for its transcription models; retry later.",
                max(1, *(service.worker.retry_after() for service in services)),
            )
        self.in_hand += 1
        place = Place(self)
        try:
            yield place
        finally:
            place.queued()


class Place:
    """One upload's place, held until its job is queued (or it ends)."""

    def __init__(self, admission: UploadAdmission) -> None:
        self._admission: UploadAdmission | None = admission

    def queued(self) -> None:
        """The upload's job is in its model's queue (or the upload ended): the place is
        the queue's now. Once; later calls do nothing."""
        if self._admission is not None:
            self._admission.in_hand -= 1
            self._admission = None
