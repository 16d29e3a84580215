"""The floor of plain values that every other package imports, and that imports none of them.

`task` (Task, TaskLimits, Split), `verdict` (Verdict, Outcome), `generation` (SamplingParams,
Message, GenerationRequest, Completion, PolicyVersion) and `trajectory` (Trajectory, Turn,
ErrorInfo, Status). Every arrow of the data flow carries one of these; each is serialisable.
"""
