"""lightfed on Flower 1.42 (Message API): the pieces of engine/flower_app.py, one concern each.

    config.py       engine options; the lightfed config in the run config and as a digest in every message
    records.py      a client's stats in a MetricRecord; the bytes of Flower's envelope
    client.py       the ClientApp's handlers: train (protocol.client_round on the node), query (discovery, secagg)
    node_worker.py  deployment: one long-lived process per node that keeps torch and the built model
    server.py       the ServerApp's loop: local.run's round with Flower carrying the bytes
    faults.py       injected faults (tests, CI)
    processes.py    the environment Flower's processes run in; Ray's leftovers
    compare.py      are two results folders the same run?
engine/flower_app.py wires them into the ServerApp / ClientApp that `flwr run` loads and runs the Simulation Engine.
Nothing here imports torch at import time: a client app answering a query stays cheap.
"""
