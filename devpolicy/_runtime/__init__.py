"""JAX's process knobs (`runtime:`): which variable or option carries each one, how a
value is checked, and putting them into effect before JAX starts.

Below the policy document, which validates `runtime:` with these checks; JAX is imported
only inside the functions that apply or read a knob, never at module level.
"""
