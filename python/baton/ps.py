"""baton.ps: baton's parameter server (ps/) from Python.

    import baton.ps as ps
    spec = ps.PsSpec([ps.Dense("fc.weight", (10, 784), optimizer=torch.optim.SGD, lr=0.1)],
                     consistency="async", num_trainers=2)
    # servers, before init_rpc:  server = ps.PsServer(spec, server=k, num_servers=n)
    rpc.init_rpc(ps_server=server)          # (servers)   rpc.init_rpc() (trainers)
    client = ps.PsClient(spec, servers=["ps0", "ps1"], trainer=t)
    w = client.pull("fc.weight").wait()
    client.push("fc.weight", grad, end_step=True).wait()

The servers may also be C++ processes (ps/server.h) with the same spec. A
module's parameters bind to dense tables with ModuleBinding. Operations
return torch.futures.Future, complete by the client's timeout; errors are
baton.rpc's exception classes (ps/client.h lists the codes).
"""
import torch

from baton import _C, _errors
from baton import rpc as _rpc

__all__ = ["Dense", "Embedding", "PsSpec", "PsServer", "PsClient", "ModuleBinding"]

_OPTIMIZERS = {torch.optim.SGD: "SGD", torch.optim.Adam: "Adam", torch.optim.AdamW: "AdamW",
               torch.optim.Adagrad: "Adagrad", torch.optim.RMSprop: "RMSprop"}


def Dense(name, shape, dtype=torch.float32, optimizer=torch.optim.SGD, **options):
    """A dense table: one tensor of `shape`, trained by `optimizer` (a
    torch.optim class among SGD, Adam, AdamW, Adagrad, RMSprop) with its
    options (lr=..., momentum=...)."""
    kind = _OPTIMIZERS.get(optimizer)
    if kind is None:
        raise ValueError(f"ps table '{name}': optimizer must be one of "
                         f"{', '.join('torch.optim.' + k for k in _OPTIMIZERS.values())}")
    if "betas" in options:
        options["betas"] = tuple(float(b) for b in options["betas"])
    return {"name": name, "kind": "dense", "shape": [int(d) for d in shape], "dtype": dtype,
            "optimizer": (kind, dict(options))}


def Embedding(name, rows, dim, dtype=torch.float32, init=("zeros",), optimizer="sgd", lr=0.01):
    """An embedding table of rows x dim, rows made on first pull from `init`
    (("zeros",), ("uniform", scale, seed), ("normal", std, seed)) and trained
    row-wise by `optimizer` ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam")."""
    if optimizer not in ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam"):
        raise ValueError(f"ps table '{name}': unknown row optimizer {optimizer!r}")
    if init[0] not in ("zeros", "uniform", "normal"):
        raise ValueError(f"ps table '{name}': unknown init {init!r}")
    init = (tuple(init) + (0.0, 0))[:3]  # (kind, scale, seed)
    return {"name": name, "kind": "embedding", "rows": int(rows), "dim": int(dim),
            "dtype": dtype, "init": init, "optimizer": (optimizer, float(lr))}


class PsSpec:
    """The tables and the consistency: "sync", "async" or ("ssp", staleness)."""

    def __init__(self, tables, consistency="async", num_trainers=1, trainer_timeout=30.0,
                 straggler_policy="drop"):
        if isinstance(consistency, str):
            consistency = (consistency, 0)
        if consistency[0] not in ("sync", "async", "ssp"):
            raise ValueError(f"consistency {consistency!r}: use 'sync', 'async' or ('ssp', k)")
        self.value = {"tables": list(tables), "consistency": tuple(consistency),
                      "num_trainers": int(num_trainers),
                      "trainer_timeout": float(trainer_timeout),
                      "straggler_policy": straggler_policy}


class PsServer:
    """A server shard hosted by this worker: pass it to init_rpc(ps_server=...)."""

    def __init__(self, spec, server, num_servers, checkpoint_dir="", checkpoint_every_clocks=0):
        try:
            self._c = _C.PsServerHost(spec.value, int(server), int(num_servers),
                                      checkpoint_dir, int(checkpoint_every_clocks))
        except _C.StatusError as e:
            raise _errors.translate(e, None, "PsServer") from None

    def stats(self):
        return self._c.stats()


def _future(cfuture, what):
    return _rpc._torch_future(cfuture, None, what)


class PsClient:
    """A trainer's handle on the servers (ps/client.h)."""

    def __init__(self, spec, servers, trainer=0, timeout=60.0):
        try:
            self._c = _C.PsClient(_rpc._current(), spec.value, int(trainer), list(servers),
                                  float(timeout))
        except _C.StatusError as e:
            raise _errors.translate(e, None, "PsClient") from None

    def _call(self, what, method, *args):
        try:
            return _future(getattr(self._c, method)(*args), what)
        except _C.StatusError as e:
            raise _errors.translate(e, None, what) from None

    def init_dense(self, values):
        """{table: tensor}: initial values (the first trainer's win)."""
        try:
            self._c.init_dense(list(values), list(values.values()))
        except _C.StatusError as e:
            raise _errors.translate(e, None, "init_dense") from None

    def pull(self, table):
        return self._call(f"pull of '{table}'", "pull", table)

    def pull_dense(self, tables, into=None):
        if into is None:
            return self._call("pull_dense", "pull_dense", list(tables))
        return self._call("pull_dense", "pull_dense_into", list(tables), list(into))

    def pull_rows(self, table, ids):
        return self._call(f"pull_rows of '{table}'", "pull_rows", table, ids)

    def push(self, table, grad, end_step=False):
        return self._call(f"push to '{table}'", "push", table, grad, bool(end_step))

    def push_dense(self, tables, grads, end_step=False):
        return self._call("push_dense", "push_dense", list(tables), list(grads), bool(end_step))

    def push_rows(self, table, ids, grads, end_step=False):
        return self._call(f"push_rows to '{table}'", "push_rows", table, ids, grads,
                          bool(end_step))

    def step(self):
        return self._call("step", "step")

    def clock(self):
        return self._c.clock()

    def stats(self):
        try:
            return self._c.stats()
        except _C.StatusError as e:
            raise _errors.translate(e, None, "stats") from None


class ModuleBinding:
    """A torch.nn.Module whose parameters live on the servers, one dense
    table per parameter ("<prefix>.<name>"), as ps/module_binding.h:

        spec = ps.PsSpec(ps.ModuleBinding.tables(model, "mlp", torch.optim.SGD, lr=0.05))
        binding = ps.ModuleBinding(client, model, "mlp")
        binding.pull(); loss.backward(); binding.push()
    """

    @staticmethod
    def tables(module, prefix, optimizer=torch.optim.SGD, **options):
        return [Dense(f"{prefix}.{n}", p.shape, p.dtype, optimizer, **options)
                for n, p in module.named_parameters()]

    def __init__(self, client, module, prefix):
        self._client = client
        self._names = [f"{prefix}.{n}" for n, _ in module.named_parameters()]
        self._params = [p for _, p in module.named_parameters()]
        self._last_push = None
        # The servers hold host tensors: device parameters offer host copies,
        # pull() copies onto the device in place, push() sends host copies.
        client.init_dense({n: p.detach().cpu() for n, p in zip(self._names, self._params)})
        self.pull()

    def pull(self):
        """Waits for the previous push, then loads the servers' values in place."""
        if self._last_push is not None:
            self._last_push.wait()
        with torch.no_grad():
            self._client.pull_dense(self._names, [p.detach() for p in self._params]).wait()

    def push(self, end_step=True):
        """Sends every parameter's .grad (zeros without one); returns at once."""
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).cpu()
                 for p in self._params]
        self._last_push = self._client.push_dense(self._names, grads, end_step)
        return self._last_push
