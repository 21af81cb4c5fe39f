"""Suite-wide settings. Property tests have no per-example deadline: this runs on shared 2-core
machines, where timing is noise; their speed is watched by the suite's total time instead."""

from hypothesis import settings

settings.register_profile("berth", deadline=None, print_blob=True)
settings.load_profile("berth")
