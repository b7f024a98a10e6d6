"""Encoding generated media into the files clients download (MP4 video, still thumbnails)."""
