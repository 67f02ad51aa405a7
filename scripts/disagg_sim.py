#!/usr/bin/env python3
"""A discrete-event simulator of disaggregated serving (docs/disaggregated.md, "Simulator"): N prefill
and M decode workers behind a router, Poisson arrivals, each prompt's KV sent prefill -> decode over a
link of given bandwidth, layer by layer as the prefill advances; predicts JCT, TTFT and TPOT per KV codec.

The model, as slimkv runs it:
- Router: at arrival, picks the decode worker with the fewest requests (running + waiting + in transfer)
  and the prefill worker that frees up first (the least in flight), as `slimkv router` does.
- Prefill worker: one prompt at a time, FIFO; a prompt of n tokens takes (at its speed alone)
  prefill_s(n) = prefill_base_s + prefill_s_per_token * n + prefill_s_per_token2 * n^2 (attention's share).
- Host path (host_path_s_per_byte[codec], measured by bench/bench_kv_host_path.cc or, on the GPU,
  bench/cuda/bench_kv_transport_cuda.cc's TCP row; absent: free): the prefill worker's export of the KV
  into transfer bytes costs `export` seconds a byte on its scheduler thread, on top of the compute
  (each layer's as it is computed when layers overlap, else the whole KV after the prefill); sending
  and receiving a piece costs `stream` seconds a byte on the hosts, which runs beside the link's pacing
  (the token bucket refills while the bytes are written), so a piece takes the longer of the two:
  bytes * stream, and the link's pacing — or, stream_then_pace, the sum of the two (what slimkv's GPU TCP
  path measures: a lone FP16 request's first token after the prefill, export, stream, pacing and import
  one after the other; docs/disaggregated.md); the decode worker's import costs `import` seconds a byte on its
  scheduler thread, at the step boundary where the request joins: it delays that worker's running
  requests too.
- Link: each prefill worker sends over its own link of link_gbps (a NIC; 0 = infinite). Layer l's KV
  (kv_bytes_per_token[codec] * n / num_layers bytes) is ready when layer l is computed (and exported):
  when the worker's work, busy_s(n) in all, passes busy_s(n) * (l + 1) / num_layers of it; the link sends
  the layers in order, one after another.
  A worker's transfers queue on its link, so one prompt's transfer can overlap the next prompt's compute.
  link_shared false: each transfer is paced on its own instead (slimkv's --kv-bandwidth-gbps is a token
  bucket per stream: two streams at once each get the cap), as in the measured runs on one machine.
  link_burst_bytes: the pacing is a token bucket of that many bytes, empty when its stream opens (as the
  prefill starts; a worker's shared link at time 0) and refilled at the link's rate while nothing is
  sent, so a sender that was busy elsewhere makes the time up, as a NIC drains its send buffer
  (slimkv's TokenBucket holds 4 MiB); 0: every byte paced (a real link).
  overlap_layers false: every layer is sent after the whole prefill and export (slimkv's GPU prefill
  worker before 3b18aed, which had no per-layer hook).
- Decode worker: continuous batching, at most max_batch sequences; a request joins at the next step
  boundary after its whole KV has arrived (imported there), and its first token (sampled by the prefill
  worker) is out then (TTFT); first_token_on_arrival: when its KV has arrived, before the wait and the
  import (slimkv before 539a363, whose runs measured TTFT so). Each step gives every running sequence
  one token and takes (at its speed alone)
  decode_step_s = step_base_s + step_s_per_seq * batch + step_s_per_context_token * (tokens in the batch's contexts).
- Shared device (shared_devices: [[prefill worker, decode worker], ...]): the two workers of a pair run on
  one device, e.g. one GPU or one CPU's cores. A worker's work in progress on it (a prompt's prefill and
  export; a decode step; an import) progresses at its speed alone while the other worker is idle, and at
  device_share of it while both have work in progress (processor sharing). Its value comes from the
  device, not from a fit: 1/2 for one GPU, which time-slices the contexts of two processes (one runs at
  a time); on a CPU, whose scheduler shares the cores among the threads that want them, the cores over
  the cores the two workers keep busy when alone, at most 1. The link and the hosts' stream are not on it;
  nor, host_path_on_device false, the export and import: on a GPU they are copies and host threads, which
  the time-slicing of the kernels does not slow. A work that is partly off the device (a prefill's
  compute and export: the compute's share f of it) is slowed by the other's work only where both are on
  it: its time stretches by 1 + f * f_other * (1 / device_share - 1).
- JCT = last token - arrival; TPOT = (last token - first token) / (output tokens - 1).

Costs come from measurements (bench/ and the router's metrics: prefill time per token, decode step time
vs batch and context, KV bytes per token of each codec); scripts/disagg_sim_example.json shows the
inputs. tests/sim/disagg_sim_test.py and docs/disaggregated.md hold it against measured runs.

Usage: disagg_sim.py CONFIG.json [--json OUT.json]      (Debian's python3 only)
"""
import argparse
import collections
import functools
import heapq
import json
import math
import random
import statistics
import sys


class Config:
    """The inputs, with their defaults; unknown keys are refused by name."""

    DEFAULTS = {
        "prefill_workers": 1, "decode_workers": 1, "link_gbps": 10.0, "num_layers": 32,
        "overlap_layers": True,    # send layer l as soon as it is computed; False: all after the prefill
        "link_shared": True,       # a prefill worker's transfers share its link; False: each paced alone
        "link_burst_bytes": 0,     # the pacing's token bucket: bytes sent unpaced when full (slimkv: 4194304)
        # A prompt runs in steps of at most this many tokens (slimkv serve --prefill-chunk-tokens; 0: one
        # step). overlap_chunks: every chunk's layers go out as computed; false: the earlier chunks' KV
        # waits for the last chunk's step and goes out with its layers (slimkv's CPU worker before #23's
        # chunk streaming).
        "prefill_chunk_tokens": 0, "overlap_chunks": True,
        "arrival_rate_per_s": 1.0, "num_requests": 1000, "seed": 0,
        "prompt_tokens": [1024],   # each request draws one uniformly
        "output_tokens": [128],
        "prefill_base_s": 0.0, "prefill_s_per_token": 1e-4, "prefill_s_per_token2": 0.0,
        "step_base_s": 0.01, "step_s_per_seq": 0.0, "step_s_per_context_token": 0.0,
        "max_batch": 64,
        "first_token_on_arrival": False,  # the first token out when the KV has arrived; False: when it joins
        "kv_bytes_per_token": {"dense:dtype=f16": 131072},  # codec -> bytes of one token's KV, all layers
        # codec -> {"export", "stream", "import": seconds per transfer byte}: the host path (see above)
        "host_path_s_per_byte": {},
        # [[arrival s, prompt tokens, output tokens], ...]: a given workload (a measured run's) instead of
        # num_requests Poisson arrivals at arrival_rate_per_s
        "requests": None,
        # [[prefill worker, decode worker], ...]: pairs that share one device; while both run, each
        # progresses at device_share of its speed alone
        "shared_devices": [], "device_share": 0.5,
        # false: the export and import run off the shared device (a GPU's copies and host threads)
        "host_path_on_device": True,
        "stream_then_pace": False,  # a piece's stream work and its pacing add up (see above)
    }

    def __init__(self, values):
        unknown = set(values) - set(self.DEFAULTS)
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; expected some of {sorted(self.DEFAULTS)}")
        merged = dict(self.DEFAULTS, **values)
        for key, value in merged.items():
            setattr(self, key, value)
        for key in ("prefill_workers", "decode_workers", "num_layers", "num_requests", "max_batch"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key}: must be an integer >= 1, got {getattr(self, key)!r}")
        for key in ("link_gbps", "arrival_rate_per_s", "link_burst_bytes"):
            if not isinstance(getattr(self, key), (int, float)) or getattr(self, key) < 0:
                raise ValueError(f"{key}: must be a number >= 0, got {getattr(self, key)!r}")
        if self.arrival_rate_per_s <= 0:
            raise ValueError("arrival_rate_per_s: must be > 0")
        for key in ("prompt_tokens", "output_tokens"):
            values = getattr(self, key)
            if not isinstance(values, list) or not values or not all(isinstance(v, int) and v >= 1 for v in values):
                raise ValueError(f"{key}: must be a non-empty list of integers >= 1, got {values!r}")
        for key in ("overlap_layers", "overlap_chunks", "link_shared", "first_token_on_arrival", "host_path_on_device",
                    "stream_then_pace"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.prefill_chunk_tokens, int) or self.prefill_chunk_tokens < 0:
            raise ValueError(f"prefill_chunk_tokens: must be an integer >= 0, got {self.prefill_chunk_tokens!r}")
        if not isinstance(self.kv_bytes_per_token, dict) or not self.kv_bytes_per_token:
            raise ValueError("kv_bytes_per_token: must map codec names to bytes per token")
        if not isinstance(self.host_path_s_per_byte, dict):
            raise ValueError("host_path_s_per_byte: must map codec names to {export, stream, import} seconds per byte")
        for codec, costs in self.host_path_s_per_byte.items():
            if (not isinstance(costs, dict) or set(costs) != {"export", "stream", "import"}
                    or not all(isinstance(v, (int, float)) and v >= 0 for v in costs.values())):
                raise ValueError(f"host_path_s_per_byte[{codec!r}]: must be {{\"export\", \"stream\", \"import\"}} "
                                 f"seconds per byte >= 0, got {costs!r}")
        if self.requests is not None:
            if not isinstance(self.requests, list) or not self.requests:
                raise ValueError(f"requests: must be a non-empty list of [arrival_s, prompt_tokens, output_tokens], got {self.requests!r}")
            for i, r in enumerate(self.requests):
                if (not isinstance(r, list) or len(r) != 3 or not isinstance(r[0], (int, float)) or r[0] < 0
                        or not all(isinstance(v, int) and v >= 1 for v in r[1:])):
                    raise ValueError(f"requests[{i}]: must be [arrival_s >= 0, prompt_tokens >= 1, output_tokens >= 1], got {r!r}")
            self.num_requests = len(self.requests)
        if not isinstance(self.shared_devices, list):
            raise ValueError(f"shared_devices: must be a list of [prefill worker, decode worker] pairs, got {self.shared_devices!r}")
        for i, pair in enumerate(self.shared_devices):
            if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, int) for v in pair)
                    or not 0 <= pair[0] < self.prefill_workers or not 0 <= pair[1] < self.decode_workers):
                raise ValueError(f"shared_devices[{i}]: must be [prefill worker in [0, {self.prefill_workers}), "
                                 f"decode worker in [0, {self.decode_workers})], got {pair!r}")
        for side, name in ((0, "prefill"), (1, "decode")):
            workers = [pair[side] for pair in self.shared_devices]
            if len(set(workers)) != len(workers):
                raise ValueError(f"shared_devices: a {name} worker is in two pairs ({workers}); a worker runs on one device")
        if not isinstance(self.device_share, (int, float)) or not 0 < self.device_share <= 1:
            raise ValueError(f"device_share: must be a number in (0, 1], got {self.device_share!r}")

    def prefill_s(self, tokens):
        return self.prefill_base_s + self.prefill_s_per_token * tokens + self.prefill_s_per_token2 * tokens * tokens

    def host_path(self, codec):
        return self.host_path_s_per_byte.get(codec, {"export": 0.0, "stream": 0.0, "import": 0.0})

    def busy_s(self, tokens, bytes_per_token, codec):
        """The prefill worker's time for a prompt's first `tokens` tokens: compute, and the export of their KV."""
        if tokens == 0:
            return 0.0
        return self.prefill_s(tokens) + self.host_path(codec)["export"] * bytes_per_token * tokens

    def kv_pieces(self, start, tokens, bytes_per_token, codec):
        """[(ready time, bytes)] of one prompt's KV in the order the link sends them: per chunk, per
        layer, each ready when its layer of its chunk is computed and exported (a chunk costs busy_s's
        increment)."""
        chunk = self.prefill_chunk_tokens or tokens
        bounds = list(range(0, tokens, chunk)) + [tokens]
        end = start + self.busy_s(tokens, bytes_per_token, codec)
        if not self.overlap_layers:
            return [(end, bytes_per_token * tokens)]
        pieces = []
        for first, last in zip(bounds, bounds[1:]):
            t0 = start + self.busy_s(first, bytes_per_token, codec)
            t1 = start + self.busy_s(last, bytes_per_token, codec)
            final = last == tokens
            for layer in range(self.num_layers):
                ready = t0 + (t1 - t0) * (layer + 1) / self.num_layers
                if self.overlap_chunks or final:
                    # the last chunk's step carries every earlier chunk's KV too when chunks do not overlap
                    sent = last - first if self.overlap_chunks else tokens
                    pieces.append((ready, bytes_per_token * sent / self.num_layers))
        return pieces

    def step_s(self, batch, context_tokens):
        return self.step_base_s + self.step_s_per_seq * batch + self.step_s_per_context_token * context_tokens


class Request:
    def __init__(self, index, arrival, prompt, output):
        self.index, self.arrival, self.prompt, self.output = index, arrival, prompt, output
        self.first_token = self.last_token = None
        self.generated = 0


def workload(config):
    """The same arrivals and lengths for every codec (one seed, or the given requests)."""
    if config.requests is not None:
        return [Request(i, float(r[0]), r[1], r[2]) for i, r in enumerate(sorted(config.requests, key=lambda r: r[0]))]
    rng = random.Random(config.seed)
    t, requests = 0.0, []
    for i in range(config.num_requests):
        t += rng.expovariate(config.arrival_rate_per_s)
        requests.append(Request(i, t, rng.choice(config.prompt_tokens), rng.choice(config.output_tokens)))
    return requests


class Work:
    """A worker's work in progress on its device: `total` seconds at the worker's speed alone, of which
    the share `on_device` runs on the device (the rest: host work that sharing does not slow). `marks`
    ([(seconds of work done, action(time))], in order) run as the work passes them (a prefill's KV pieces
    becoming sendable), `on_done(time)` at its end."""

    def __init__(self, total, on_done, marks=(), on_device=1.0):
        self.total, self.on_done, self.marks, self.on_device = total, on_done, list(marks), on_device
        self.done, self.rate, self.since = 0.0, 1.0, 0.0  # work done by `since`, progressing at `rate`
        self.version = 0  # its end event's: a rate change voids the event pushed before it


class Device:
    """What a worker runs on: its own, or one shared by a prefill and a decode worker (shared_devices),
    whose two works in progress each progress at `share` of their speed alone (processor sharing)."""

    def __init__(self, share):
        self.share, self.works = share, []


class Link:
    """A prefill worker's link (link_shared), or one stream's: pieces go out in order, each paced by the
    cap as a token bucket of `burst` bytes (empty at `opened`; 0: every byte paced) and by the hosts' sending
    and receiving (`stream_s_per_byte`), which run side by side."""

    def __init__(self, gbps, stream_s_per_byte, burst, stream_then_pace=False, opened=0.0):
        self.bytes_per_s = gbps * 1e9 / 8 if gbps > 0 else None  # None: no cap
        self.stream_s_per_byte, self.burst, self.stream_then_pace = stream_s_per_byte, burst, stream_then_pace
        self.free_at = 0.0
        self.tokens, self.refilled_at = 0.0, opened  # bytes that may go out unpaced at `refilled_at`; < 0: owed

    def send(self, ready, piece_bytes):
        """The piece, sendable at `ready`, is sent after the earlier ones; returns when it has arrived."""
        start = max(self.free_at, ready)
        if self.stream_then_pace:
            start += piece_bytes * self.stream_s_per_byte
        paced = start
        if self.bytes_per_s:
            self.tokens = min(self.burst, self.tokens + (start - self.refilled_at) * self.bytes_per_s) - piece_bytes
            self.refilled_at = start
            paced = start + max(0.0, -self.tokens) / self.bytes_per_s
        self.free_at = paced if self.stream_then_pace else max(paced, start + piece_bytes * self.stream_s_per_byte)
        return self.free_at


class PrefillWorker:
    def __init__(self, device, link):
        self.device, self.link = device, link  # link: its own (link_shared), else None
        self.queue = collections.deque()  # (request, decode worker) waiting, FIFO
        self.busy = False
        self.free_at = 0.0     # the router's view: when its queue clears at its speed alone


class DecodeWorker:
    def __init__(self, device):
        self.device = device
        self.assigned = 0    # requests sent here and not finished (the router's load)
        self.ready = []      # KV arrived, waiting to join the batch
        self.running = []
        self.stepping = False  # a step (or the import before it) is in progress


def devices_of(config):
    """Each prefill worker's and each decode worker's device: a pair of shared_devices has one."""
    prefill = [Device(config.device_share) for _ in range(config.prefill_workers)]
    decode = [Device(config.device_share) for _ in range(config.decode_workers)]
    for p, d in config.shared_devices:
        decode[d] = prefill[p]
    return prefill, decode


def simulate(config, codec):
    """Runs the workload with one codec's KV size; returns the requests with their times."""
    bytes_per_token = config.kv_bytes_per_token[codec]
    host_path = config.host_path(codec)
    import_s_per_byte = host_path["import"]
    requests = workload(config)

    def new_link(opened=0.0):
        return Link(config.link_gbps, host_path["stream"], config.link_burst_bytes, config.stream_then_pace, opened)
    prefill_devices, decode_devices = devices_of(config)
    prefills = [PrefillWorker(device, new_link() if config.link_shared else None) for device in prefill_devices]
    decoders = [DecodeWorker(device) for device in decode_devices]
    events = []  # (time, order, kind, payload): a heap; `order` keeps ties in insertion order
    order = 0

    def push(time, kind, payload):
        nonlocal order
        heapq.heappush(events, (time, order, kind, payload))
        order += 1

    # --- a device's works, processor-shared ---

    def catch_up(device, now, finished=None):
        """Every work on the device brought to `now` at its rate since its last change (`finished`: to its
        end); the marks it passed run at the times it passed them."""
        for work in device.works:
            done = work.total if work is finished else work.done + (now - work.since) * work.rate
            while work.marks and work.marks[0][0] <= done:
                offset, action = work.marks.pop(0)
                action(min(now, work.since + (offset - work.done) / work.rate))
            work.done, work.since = done, now

    def set_rates(device, now):
        """Each work's rate for what runs now, and its end event at that rate."""
        for work in device.works:
            others = max((w.on_device for w in device.works if w is not work), default=0.0)
            work.rate = 1.0 / (1.0 + work.on_device * others * (1.0 / device.share - 1.0))
            work.version += 1
            push(now + (work.total - work.done) / work.rate, "work_done", (device, work, work.version))

    def run_work(device, work, now):
        catch_up(device, now)
        work.since = now
        device.works.append(work)
        set_rates(device, now)

    # --- prefill workers ---

    def start_prefill(p, now):
        """The prefill worker's next prompt: compute and export as one work, each KV piece sent over the
        link (in order) as the work passes it."""
        worker = prefills[p]
        request, d = worker.queue.popleft()
        worker.busy = True
        pieces = config.kv_pieces(0.0, request.prompt, bytes_per_token, codec)  # (seconds of work, bytes)
        link = worker.link or new_link(now)

        def send(piece_bytes, last, ready):
            arrived = link.send(ready, piece_bytes)
            if last:
                push(arrived, "kv_arrived", (request, d))
        marks = [(offset, functools.partial(send, piece_bytes, i == len(pieces) - 1))
                 for i, (offset, piece_bytes) in enumerate(pieces)]
        busy = config.busy_s(request.prompt, bytes_per_token, codec)
        on_device = 1.0 if config.host_path_on_device or busy == 0 else config.prefill_s(request.prompt) / busy
        run_work(worker.device, Work(busy, functools.partial(end_prefill, p), marks, on_device), now)

    def end_prefill(p, now):
        worker = prefills[p]
        worker.busy = False
        if worker.queue:
            start_prefill(p, now)

    # --- decode workers ---

    def start_step(d, now):
        """A step boundary of decode worker d: waiting requests are imported (a work on its device) and
        join, then the next step runs if anything does."""
        worker = decoders[d]
        room = config.max_batch - len(worker.running)
        joining, worker.ready = worker.ready[:room], worker.ready[room:]
        worker.stepping = True
        import_s = sum(import_s_per_byte * bytes_per_token * r.prompt for r in joining)
        if import_s > 0:
            run_work(worker.device, Work(import_s, functools.partial(join, d, joining), (),
                                         1.0 if config.host_path_on_device else 0.0), now)
        else:
            join(d, joining, now)

    def join(d, joining, now):
        """The imported requests join (their first token is out, unless it was when the KV arrived) and the
        next step starts."""
        worker = decoders[d]
        for request in joining:
            request.generated = 1
            if not config.first_token_on_arrival:
                request.first_token = now
            if request.generated >= request.output:
                request.last_token = now
                worker.assigned -= 1
            else:
                worker.running.append(request)
        worker.stepping = bool(worker.running)
        if worker.running:
            context = sum(r.prompt + r.generated for r in worker.running)
            run_work(worker.device, Work(config.step_s(len(worker.running), context), functools.partial(end_step, d)), now)

    def end_step(d, now):
        """Every running sequence has its next token; the finished leave."""
        worker = decoders[d]
        still = []
        for request in worker.running:
            request.generated += 1
            if request.generated >= request.output:
                request.last_token = now
                worker.assigned -= 1
            else:
                still.append(request)
        worker.running = still
        start_step(d, now)

    for request in requests:
        push(request.arrival, "arrive", request)
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            request = payload
            d = min(range(len(decoders)), key=lambda i: decoders[i].assigned)
            decoders[d].assigned += 1
            p = min(range(len(prefills)), key=lambda i: prefills[i].free_at)
            prefills[p].free_at = max(now, prefills[p].free_at) + config.busy_s(request.prompt, bytes_per_token, codec)
            prefills[p].queue.append((request, d))
            if not prefills[p].busy:
                start_prefill(p, now)
        elif kind == "work_done":
            device, work, version = payload
            if version == work.version:  # not voided by a rate change since
                catch_up(device, now, finished=work)
                device.works.remove(work)
                set_rates(device, now)
                work.on_done(now)
        elif kind == "kv_arrived":
            request, d = payload
            if config.first_token_on_arrival:
                request.first_token = now
            worker = decoders[d]
            worker.ready.append(request)
            if not worker.stepping:
                start_step(d, now)
    return requests


def summarize(requests):
    def stats(values):
        values = sorted(values)
        if not values:
            return {"mean": None, "p50": None, "p99": None}
        return {"mean": statistics.fmean(values), "p50": values[len(values) // 2],
                "p99": values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]}
    tpot = [(r.last_token - r.first_token) / (r.output - 1) for r in requests if r.output > 1]
    return {"jct_s": stats([r.last_token - r.arrival for r in requests]),
            "ttft_s": stats([r.first_token - r.arrival for r in requests]),
            "tpot_s": stats(tpot)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", help="a JSON file of inputs (scripts/disagg_sim_example.json)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with open(args.config) as f:
        config = Config(json.load(f))
    results = {codec: summarize(simulate(config, codec)) for codec in config.kv_bytes_per_token}
    first = next(iter(results))
    print(f"{config.prefill_workers} prefill + {config.decode_workers} decode workers, {config.link_gbps} Gbit/s links, "
          f"{config.arrival_rate_per_s} req/s, {config.num_requests} requests")
    print(f"{'codec':<24}{'KV B/token':>12}{'JCT mean s':>12}{'JCT p99 s':>11}{'TTFT mean s':>13}{'TPOT mean ms':>14}  "
          f"{'JCT vs ' + first}")
    for codec, result in results.items():
        ratio = result["jct_s"]["mean"] / results[first]["jct_s"]["mean"]
        print(f"{codec:<24}{config.kv_bytes_per_token[codec]:>12}{result['jct_s']['mean']:>12.4f}"
              f"{result['jct_s']['p99']:>11.4f}{result['ttft_s']['mean']:>13.4f}"
              f"{(result['tpot_s']['mean'] or 0) * 1e3:>14.3f}  {ratio:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(config), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"disagg_sim: {e}", file=sys.stderr)
        sys.exit(2)
