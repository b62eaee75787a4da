"""Speech task plugins."""
