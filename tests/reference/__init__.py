"""Reference implementations the production reducers are tested against: plain numpy over an
:class:`~headatlas.core.store.AttentionStore`, one sequence at a time (slow, simple). Nothing in the
package imports them; benchmarks/ does, to time the reducers against them."""
