"""Configs, runners, sweeps and plots on top of the emulator; the ``groupfel`` CLI."""
