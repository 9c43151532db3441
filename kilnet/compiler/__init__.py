"""The compiler's passes: graph -> plan (shapes, backward schedule, activation-derivative fusion,
memory, renders, bindings). ``kn.compile`` (kilnet/build.py) runs them and wraps the plan in a
Model; ops use ``symbolic`` for their activations."""
