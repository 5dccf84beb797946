"""The performance model (DESIGN §3): measure one machine, predict configurations nobody ran.

- profiler.profile_layers / layers.write_layers: the layer table (layers.json)
- microbench.run_microbench: communication microbenchmarks (comm.json)
- fit.fit_comm / fit.load_comm_model: alpha-beta-gamma fits (model.json)
- dag + simulate: the task DAG of an iteration and its list-scheduling simulator
- predict.predict / predict.predicted_timeline: iteration time, throughput,
  utilisation, critical path, predicted timelines (Gantt PNG, Chrome trace)
- validate.validate_runs: predicted against measured training runs
"""
