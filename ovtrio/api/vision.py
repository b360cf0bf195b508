"""What a vision-language model's engine is given for a chat prompt: its text with the
images' tags, and the images, read and decoded off the event loop (ovtrio/images); a
bad image is the client's 400, naming the part, before any engine work."""

from __future__ import annotations

from ovtrio.images import load_image
from ovtrio.scheduler import TextPrompt
from ovtrio.serving.service import ServingModel
from ovtrio.text.prompts import ChatPrompt


async def text_prompts(model: ServingModel, prompt: ChatPrompt) -> list[TextPrompt] | None:
    """The prompt as the model's engine takes it; None for a model that takes token ids."""
    if model.vision is None or prompt.text is None:
        return None
    images = []
    for url, param in prompt.images:
        image = await load_image(url, param, model.image_limits)  # ImageError: a 400 naming the part
        model.image_prepared(image.seconds)
        images.append(image.pixels)
    return [TextPrompt(prompt.text, tuple(images))]
