"""Worker processes and the stage engines they host."""
