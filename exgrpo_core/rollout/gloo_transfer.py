"""A CPU weight-transfer backend for vLLM's weight-transfer interface: `gloo`, the NCCL engine's protocol
over a gloo process group, for a rollout server without GPUs (vLLM's CPU build) or a trainer without one.

Both halves register in vLLM's own factories under `BACKEND`: the worker half through vLLM's general-plugin
entry point (`vllm.general_plugins` in pyproject.toml, loaded by every vLLM process where exgrpo is
installed), the trainer half when `open_transfer` runs. A push is vLLM's round trip: `/start_weight_update`,
`/update_weights` (the workers receive while the trainer broadcasts), `/finish_weight_update`; the workers
load through vLLM's layerwise reload, as its NCCL engine does. The trainer is rank 0 of a group with every
server worker (TP x PP x DP), met at a TCPStore the trainer hosts on the address it names; like NCCL's, the
rendezvous has no key (docs/scaling.md).
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, ClassVar, Iterable

import torch

BACKEND = "gloo"
TIMEOUT = datetime.timedelta(minutes=10)


def _group(host: str, port: int, rank: int, world: int):
    """A gloo group of `world` ranks met at host:port (rank 0 hosts the store)."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=TIMEOUT)
    return dist.ProcessGroupGloo(dist.PrefixStore("exgrpo-weights", store), rank, world, TIMEOUT)


def register() -> None:
    """vLLM general plugin: the worker half of the backend in vLLM's engine factory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GlooWeightTransferEngine")


def register_trainer() -> None:
    """The trainer half in vLLM's trainer factory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, __name__, "GlooTrainerEngine")


def _engine_classes():
    """The classes on vLLM's base classes, made when vLLM is importable (this module imports without it)."""
    from vllm.distributed.weight_transfer.base import (TrainerInitInfo, TrainerWeightTransferEngine,
                                                       WeightTransferEngine, WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)

    @dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        master_address: str
        master_port: int
        world_size: int
        rank_offset: int = 1

    @dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]

    @dataclass
    class GlooTrainerInitInfo(TrainerInitInfo):
        backend: ClassVar[str] = BACKEND
        master_address: str = "127.0.0.1"
        master_port: int = 0
        world_size: int = 2

    class GlooWeightTransferEngine(WeightTransferEngine):
        """The worker half: joins the group, receives each tensor and loads it (vLLM's layerwise reload)."""

        init_info_cls, update_info_cls = GlooInitInfo, GlooUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info) -> None:
            p = self.parallel_config
            rank = p.data_parallel_index * p.world_size + p.rank + init_info.rank_offset
            self.group = _group(init_info.master_address, init_info.master_port, rank, init_info.world_size)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def receive_weights(self, update_info) -> None:
            for name, dtype, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                self.group.broadcast(t, 0).wait()
                self.model.load_weights([(name, t.to(self.device))])

        def shutdown(self) -> None:
            self.group = None

    class GlooTrainerEngine(TrainerWeightTransferEngine):
        """The trainer half (rank 0): hosts the rendezvous, drives vLLM's round trip, broadcasts the tensors.
        `source` is an object whose `named` holds this push's (name, tensor) stream and `params` its
        (name, shape) list; `dtype` is the wire dtype."""

        init_info_cls = GlooTrainerInitInfo

        @classmethod
        def trainer_init(cls, init_info, *, client, source=None):
            engine = cls(client=client, source=source)
            worker = GlooInitInfo(init_info.master_address, init_info.master_port, init_info.world_size)
            with ThreadPoolExecutor(max_workers=1) as pool:  # the workers wait in the rendezvous too
                future = pool.submit(client.init_weight_transfer_engine, asdict(worker))
                engine.group = _group(init_info.master_address, init_info.master_port, 0, init_info.world_size)
                future.result()
            return engine

        def send_weights(self) -> None:
            src = self.source
            info = GlooUpdateInfo([n for n, _ in src.params], [str(src.dtype).split(".")[-1]] * len(src.params),
                                  [list(s) for _, s in src.params])
            self.client.start_weight_update()
            pool = ThreadPoolExecutor(max_workers=1)
            try:
                future = pool.submit(self.client.update_weights, asdict(info))
                sent = 0
                for (name, t), (want, shape) in zip(src.named, src.params):
                    if name != want or tuple(t.shape) != tuple(shape):
                        raise ValueError(f"weight {sent} is {name} {tuple(t.shape)}, the workers expect {want} {shape}")
                    self.group.broadcast(t.detach().to("cpu", src.dtype).contiguous(), 0).wait()
                    sent += 1
                if sent != len(src.params):
                    raise ValueError(f"{sent} weights sent, the workers expect {len(src.params)}")
                future.result()
            finally:
                pool.shutdown(wait=False)  # a failed broadcast leaves the workers waiting: do not join them
            self.client.finish_weight_update()

        def shutdown(self) -> None:
            self.group = None

    return SimpleNamespace(GlooInitInfo=GlooInitInfo, GlooUpdateInfo=GlooUpdateInfo,
                           GlooTrainerInitInfo=GlooTrainerInitInfo, GlooWeightTransferEngine=GlooWeightTransferEngine,
                           GlooTrainerEngine=GlooTrainerEngine)


def __getattr__(name: str) -> Any:  # vLLM's factories import the classes by name
    if name in ("GlooInitInfo", "GlooUpdateInfo", "GlooTrainerInitInfo", "GlooWeightTransferEngine",
                "GlooTrainerEngine"):
        classes = _engine_classes()
        globals().update(vars(classes))
        return getattr(classes, name)
    raise AttributeError(name)


def gloo_transfer(client, params: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, *, host: str, port: int):
    """`open_transfer` for rollout.weight_transfer=gloo: the trainer half, met with the server's workers;
    `send(named)` pushes one stream of whole tensors in `dtype`."""
    register_trainer()
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    workers = int(client.call("GET", "/get_world_size")["world_size"])  # TP x PP x DP
    source = SimpleNamespace(named=(), params=list(params), dtype=dtype)
    info = __getattr__("GlooTrainerInitInfo")(rank=0, master_address=host, master_port=port, world_size=workers + 1)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def send(named: Iterable) -> None:
        source.named = named
        engine.send_weights()

    return SimpleNamespace(send=send, close=engine.shutdown)
