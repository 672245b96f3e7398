"""Decisions: names (and sizes) in, `Decision`s out.

`routing` is the one fallback walk; `decider` the one place a name meets the rules, with
one cache. Everything above asks these two, never a copy of them. `decision` holds the
values they give back, `items` what a placement of many items hands in, `advice` the
warnings that name a rule to write, `rule_use` what each rule took over a load or a plan
and which rules must not pass in silence.
"""
