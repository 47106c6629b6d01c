"""The ``image_text`` kind (an image with its caption). Implemented by the multimodal work (issue 17)."""
