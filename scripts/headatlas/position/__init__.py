"""Where in a long input heads look: sink, local, entropy and distance per head by query-position bucket
(the opt-in ``position`` analysis, docs/scale.md): the reducer and its plan (reducers), the figure (figures)."""
