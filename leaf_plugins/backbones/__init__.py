"""Speech-LLM backbone plugins."""
