"""Speech out: text-to-speech models (SpeechT5 with a HiFi-GAN vocoder, as optimum-cli
exports them) on OpenVINO GenAI's Text2SpeechPipeline, served at /v1/audio/speech
(ovtrio/api/speech.py).

pieces.py splits the text at sentence ends, voices.py reads the speaker embeddings,
engine.py runs the model one piece at a time, encode.py writes the samples as wav, pcm,
flac, mp3, opus or aac, service.py loads the model lazily and queues requests (the
encoders' worker).
"""
