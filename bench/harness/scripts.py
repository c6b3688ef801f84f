"""The peers' server scripts, written into a temporary directory and run with the same
Python: the model loader every peer shares, and the mosec, LitServe and Ray Serve servers.
A workload puts its own request handling (``forward_raw``, ``from_json``, ``predict_rows``,
``to_json``) between ``LOAD`` and a server."""

# Every peer loads and calls the model as tfsupervisor's worker does (worker/runners.py):
# its inputs, in order, and the output it answers with are $PEERS_INPUTS and $PEERS_OUTPUT
# (the MLP's by default; the text workload serves its encoder with the same loader).
LOAD = '''
import os
import signal
import sys
import time

import numpy as np


def load_model():
    """serving_default of the SavedModel at $PEERS_MODEL, called on one batch per input."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loaded = tf.saved_model.load(os.environ["PEERS_MODEL"])
    fn = loaded.signatures["serving_default"]
    names = os.environ.get("PEERS_INPUTS", "features").split(",")
    output = os.environ.get("PEERS_OUTPUT", "output_0")

    def call(*arrays):
        return fn(**{n: tf.constant(a) for n, a in zip(names, arrays)})[output].numpy()

    call.keepalive = loaded  # the signature's variables live as long as the object
    return call
'''

# After a workload's script (LOAD and its own forward_raw, from_json, predict_rows and
# to_json). Each script defines ``Model``.
MOSEC_MAIN = '''

if __name__ == "__main__":
    server = Server()
    server.append_worker(Model, num=2, max_batch_size=32,
                         max_wait_time=int(float(os.environ["PEERS_WAIT_MS"])))
    server.run()
'''

LITSERVE_MAIN = '''

if __name__ == "__main__":
    api = Model(max_batch_size=32, batch_timeout=float(os.environ["PEERS_WAIT_MS"]) / 1000)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=2, timeout=60,
                          fast_queue=True)
    server.run(host="127.0.0.1", port=int(os.environ["PEERS_PORT"]), log_level="warning",
               generate_client_file=False)
'''

# mosec's command line after its script ({port} substituted).
MOSEC_ARGS = ("--address", "127.0.0.1", "--port", "{port}", "--log-level", "warning",
              "--timeout", "60000")

MOSEC_SERVER = '''
from mosec import Server, Worker


class Model(Worker):
    resp_mime_type = "application/octet-stream"

    def __init__(self):
        super().__init__()
        self.call = load_model()

    def deserialize(self, data):
        return data

    def serialize(self, data):
        return data

    def forward(self, data):
        return forward_raw(self.call, data)

''' + MOSEC_MAIN

# mosec reading and answering the Open Inference Protocol v2 JSON that tfsupervisor's HTTP
# front speaks: the same requests for both (the first input in, $PEERS_OUTPUT out).
MOSEC_OIP_SERVER = '''
import json

from mosec import Server, Worker

DATATYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}


class Model(Worker):
    resp_mime_type = "application/json"

    def __init__(self):
        super().__init__()
        self.call = load_model()
        self.output = os.environ.get("PEERS_OUTPUT", "output_0")

    def deserialize(self, data):
        first = json.loads(data)["inputs"][0]
        return np.asarray(first["data"], DATATYPES[first["datatype"]]).tobytes()

    def serialize(self, data):
        values = np.frombuffer(data, np.float32)
        return json.dumps({"model_name": "model", "outputs": [
            {"name": self.output, "shape": [1, len(values)], "datatype": "FP32",
             "data": values.tolist()}]}).encode()

    def forward(self, data):
        return forward_raw(self.call, data)

''' + MOSEC_MAIN

LITSERVE_SERVER = '''
import litserve as ls


class Model(ls.LitAPI):
    def setup(self, device):
        self.call = load_model()

    def decode_request(self, request):
        return from_json(request)

    def batch(self, inputs):
        return inputs

    def predict(self, rows):
        return predict_rows(self.call, rows)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return to_json(output)

''' + LITSERVE_MAIN

RAY_SERVER = '''
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(num_replicas=2, max_ongoing_requests=32, ray_actor_options={"num_cpus": 0})
class Model:
    def __init__(self):
        self.call = load_model()

    @serve.batch(max_batch_size=32,
                 batch_wait_timeout_s=float(os.environ["PEERS_WAIT_MS"]) / 1000)
    async def infer(self, rows):
        return forward_raw(self.call, rows)

    async def __call__(self, request: Request) -> Response:
        return Response(await self.infer(await request.body()),
                        media_type="application/octet-stream")


def stop(*_):
    raise SystemExit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 2**20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": int(os.environ["PEERS_PORT"])})
        serve.run(Model.bind(), route_prefix="/")
        while True:
            time.sleep(3600)
    finally:
        serve.shutdown()
        ray.shutdown()
'''
