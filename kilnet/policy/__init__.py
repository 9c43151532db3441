"""What the compiler decides with, below the ops: the plan's records (``plan``), buffer names
(``names``) and arena placement (``memory``), the device's ``target`` and the schedule policy
(``schedule``), vector widths (``vectors``) and the sympy maths of activations (``symbolic``).
Nothing here imports an op or a pass."""
