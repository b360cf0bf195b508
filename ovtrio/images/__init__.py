"""Images sent with a request, made ready for a vision-language model: read from a
`data:` URL (or fetched, when the server allows it), checked against the server's
limits, decoded and converted to RGB off the event loop (load.py)."""

from ovtrio.images.load import ImageError, ImageLimits, load_image

__all__ = ["ImageError", "ImageLimits", "load_image"]
