"""The performance model (DESIGN §3): measure one machine, predict configurations nobody ran.

- profiler.profile_layers / layers.write_layers: the layer table (layers.json)
- microbench.run_microbench: communication microbenchmarks (comm.json), a ping-pong per link
  class the placement uses (links.p2p_pairs)
- records: typed comm.json and layer table, schema version, migration of older files
- network/: the one description of the network: fit.fit_comm / fit.load_comm_model, the
  alpha-beta-gamma fits (model.json); costs.CommCosts, what a fit says a primitive costs;
  wire.wire_of, the fit read once for a scenario's placement; fabric, where each transfer
  runs and what it costs and holds, by link class, the one thing the DAG builders ask
- dag (allreduce) + dag_ps (SSGD-PS, OD-SGD, ASGD) + simulate: the task DAG of an iteration
  and its list-scheduling simulator
- predict.predict / predict.predict_one: iteration time, throughput, utilisation, critical
  path, or a stated no-prediction; trace: predicted timelines (Gantt PNG, Chrome trace)
- validate.validate_runs: predicted against measured training runs
"""
