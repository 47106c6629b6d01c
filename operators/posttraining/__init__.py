"""Operators for post-training kinds (chat, preference, trajectory). Importing registers them."""

from operators.posttraining import chat_quality, pii, preference_quality, prompt_dedup, trajectory_quality  # noqa: F401
