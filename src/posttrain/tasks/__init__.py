"""Tasks and task domains: `Task`, `Domain`, the family registry and task files."""

from posttrain.tasks.domain import Domain
from posttrain.values.task import Task, TaskLimits

__all__ = ["Domain", "Task", "TaskLimits"]
