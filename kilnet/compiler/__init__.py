"""The compiler's passes: graph -> plan (shapes, backward schedule, activation-derivative fusion,
memory, renders, bindings, the plan kernel). ``kn.compile`` (kilnet/build.py) runs them and wraps
the plan in a Model. They sit above the ops; what they decide with is kilnet/policy/."""
