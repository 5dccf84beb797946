"""The one description of the network (DESIGN §3, docs/model-core.md): the microbenchmark's
measurements fitted per primitive and world (fit: model.json), what a fit says a transfer costs
(costs.CommCosts), that read once for a scenario's placement (wire.wire_of: a `Wire`), and the
fabric that alone reads a wire and answers every transfer of an iteration: its time, what it
holds, when a shard's pulls are back, what a push waits for. links: what the kernel's sockets
and a placement's link classes are, which the microbenchmark measures by.

Imports infra and training below it and the measured records (modelling.measure); the DAG
builders, the simulator and prediction import it, never the other way.
"""
