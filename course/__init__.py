"""Helpers shared by the mixed precision lessons.

Each public function says which lesson introduced it. Nothing here solves a graded exercise:
the lessons ask students to write those, and the graders test them.
"""

from course.device import (
    CourseEnv,
    DeviceProfile,
    describe_device,
    pick_device,
    seed_everything,
    setup,
)

__all__ = [
    "CourseEnv",
    "DeviceProfile",
    "describe_device",
    "pick_device",
    "seed_everything",
    "setup",
]
__version__ = "0.1.0"
