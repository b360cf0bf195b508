"""Speech in: Whisper models on OpenVINO GenAI's WhisperPipeline, served at
/v1/audio/transcriptions and /v1/audio/translations (ovtrio/api/audio.py).

form.py splits the upload, decode.py turns the file into 16 kHz mono samples, engine.py
runs the model a 30 s window at a time, service.py loads it lazily and queues requests
(the encoders' worker), transcripts.py writes OpenAI's response formats.
"""
