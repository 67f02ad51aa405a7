"""scripts/disagg_sim.py against answers known in closed form: one request alone (prefill, the layer-
pipelined transfer, decode steps), the transfer time of a bandwidth-bound prompt, batch-dependent TPOT,
the host path (export, stream beside the link, import at the decode worker's step boundary), and the
prefill worker as an M/D/1 queue (Pollaczek-Khinchine mean wait), workers sharing one device, a paced
link's burst; and against measured runs: the GPU JCT run at 10 Gbit/s with both workers on one H100
(docs/results/disaggregated/jct_one_h100_10g_layers/) fed with the costs and host path that run calibrated,
and the two-GPU runs. Usage: disagg_sim_test.py SOURCE_DIR"""
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True
SOURCE_DIR = sys.argv[1]
sys.path.insert(0, os.path.join(SOURCE_DIR, "scripts"))
import disagg_sim  # noqa: E402


def run(codec="c", **values):
    values.setdefault("kv_bytes_per_token", {"c": 1000})
    config = disagg_sim.Config(values)
    return config, disagg_sim.simulate(config, codec)


class DisaggSimTest(unittest.TestCase):
    def assertTimes(self, actual, expected):
        for a, e in zip(actual, expected, strict=True):
            self.assertAlmostEqual(a, e, places=9, msg=(actual, expected))

    def test_one_request_alone(self):
        # 1000 tokens, 10 layers: 0.1 s of compute (10 ms a layer). 100 KB/token at 1 Gbit/s: 0.8 s of
        # transfer (80 ms a layer) > compute, so the link is the bottleneck: the last byte arrives
        # after the first layer's compute plus all ten layers' transfer.
        config, [request] = run(num_requests=1, prompt_tokens=[1000], output_tokens=[5], num_layers=10,
                                prefill_s_per_token=1e-4, link_gbps=1, kv_bytes_per_token={"c": 100000},
                                step_base_s=0.02, arrival_rate_per_s=1.0)
        kv_arrived = 0.01 + 10 * 0.08
        self.assertAlmostEqual(request.first_token - request.arrival, kv_arrived, places=9)
        self.assertAlmostEqual(request.last_token - request.arrival, kv_arrived + 4 * 0.02, places=9)
        # A fast link: the transfer hides behind the compute but for the last layer's (1e7 bytes).
        _, [request] = run(num_requests=1, prompt_tokens=[1000], output_tokens=[1], num_layers=10,
                           prefill_s_per_token=1e-4, link_gbps=1000, kv_bytes_per_token={"c": 100000})
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 1e7 * 8 / 1e12, places=9)
        # Without layer overlap (every layer sent after the prefill): compute + the whole transfer.
        _, [request] = run(num_requests=1, prompt_tokens=[1000], output_tokens=[1], num_layers=10,
                           prefill_s_per_token=1e-4, link_gbps=1, kv_bytes_per_token={"c": 100000},
                           overlap_layers=False)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 0.8, places=9)
        # No link cost at all (link_gbps 0 = infinite) and a quadratic prefill term.
        _, [request] = run(num_requests=1, prompt_tokens=[2000], output_tokens=[1], prefill_base_s=0.5,
                           prefill_s_per_token=1e-4, prefill_s_per_token2=1e-7, link_gbps=0)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.5 + 0.2 + 0.4, places=9)

    def test_chunked_prefill_overlap(self):
        # 1000 tokens in 4 chunks of 250, 10 layers, 0.1 s of compute (25 ms a chunk, 2.5 ms a chunk's
        # layer); 100 KB/token at 10 Gbit/s: 2.5e6 bytes = 2 ms a chunk's layer, less than its compute.
        common = dict(num_requests=1, prompt_tokens=[1000], output_tokens=[1], num_layers=10, prefill_s_per_token=1e-4,
                      link_gbps=10, kv_bytes_per_token={"c": 100000}, prefill_chunk_tokens=250)
        # Every chunk streams as computed: the link keeps up, the last piece leaves when the last layer
        # of the last chunk is computed and takes 2 ms.
        _, [request] = run(**common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 0.002, places=9)
        # Only the last chunk's step streams, each layer with every chunk's KV of it (8 ms a layer): the
        # link is then the bottleneck from the last step's first layer on.
        _, [request] = run(overlap_chunks=False, **common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.075 + 0.0025 + 10 * 0.008, places=9)

    def test_batched_decode_tpot(self):
        # Two requests whose KV lands at once on one decode worker: the first starts a step at once, the
        # second joins at that step's end (continuous batching joins at step boundaries). Every step
        # takes base + per_seq * batch + per_context * (the batch's context tokens), contexts growing a
        # token a step: step 1 {R1: 11} 12.1 ms; step 2 {R1: 12, R2: 11} 14.3 ms; step 3 {R2: 12} 12.2 ms.
        _, (first, second) = run(num_requests=2, arrival_rate_per_s=1e9, prompt_tokens=[10], output_tokens=[3],
                                 prefill_s_per_token=0.0, link_gbps=0, step_base_s=0.01, step_s_per_seq=0.001,
                                 step_s_per_context_token=0.0001, prefill_workers=2)
        self.assertAlmostEqual(first.last_token - first.first_token, 0.0121 + 0.0143, places=9)
        self.assertAlmostEqual(second.first_token - first.first_token, 0.0121, places=9)
        self.assertAlmostEqual(second.last_token - second.first_token, 0.0143 + 0.0122, places=9)

    def test_prefill_queue_is_md1(self):
        # Output of one token and no transfer cost: JCT = the prefill worker's queueing + service, an
        # M/D/1 queue. Pollaczek-Khinchine: mean wait = rho * S / (2 * (1 - rho)).
        service, rate = 0.1, 6.0  # rho = 0.6
        config, requests = run(num_requests=40000, arrival_rate_per_s=rate, prompt_tokens=[1000], output_tokens=[1],
                               prefill_s_per_token=service / 1000, link_gbps=0, seed=7)
        rho = rate * service
        expected = service + rho * service / (2 * (1 - rho))
        mean = disagg_sim.summarize(requests)["jct_s"]["mean"]
        self.assertLess(abs(mean - expected) / expected, 0.03, (mean, expected))
        # Two prefill workers at twice the rate: an M/D/2 queue waits less than two M/D/1s would.
        _, requests = run(num_requests=40000, arrival_rate_per_s=2 * rate, prompt_tokens=[1000], output_tokens=[1],
                          prefill_s_per_token=service / 1000, link_gbps=0, prefill_workers=2, seed=7)
        self.assertLess(disagg_sim.summarize(requests)["jct_s"]["mean"], expected)

    def test_smaller_kv_never_slower(self):
        values = dict(num_requests=300, arrival_rate_per_s=3.0, prompt_tokens=[4096, 16384], output_tokens=[64],
                      prefill_s_per_token=2e-5, link_gbps=10, prefill_workers=2, decode_workers=2,
                      kv_bytes_per_token={"f16": 131072, "2bit": 20480})
        config = disagg_sim.Config(values)
        f16 = disagg_sim.summarize(disagg_sim.simulate(config, "f16"))
        two_bit = disagg_sim.summarize(disagg_sim.simulate(config, "2bit"))
        self.assertLess(two_bit["jct_s"]["mean"], f16["jct_s"]["mean"])
        self.assertLess(two_bit["ttft_s"]["mean"], f16["ttft_s"]["mean"])

    def test_host_path(self):
        # 1000 tokens of 100 KB, 1e8 bytes, after a 0.1 s prefill; export 1 ns/B (0.1 s), stream 2 ns/B
        # (0.2 s: slower than a 10 Gbit/s link's 0.08 s, so the hosts set the pace), import 0.5 ns/B (0.05 s).
        host = {"c": {"export": 1e-9, "stream": 2e-9, "import": 5e-10}}
        common = dict(num_requests=1, prompt_tokens=[1000], output_tokens=[3], num_layers=10, prefill_s_per_token=1e-4,
                      link_gbps=10, kv_bytes_per_token={"c": 100000}, step_base_s=0.02, host_path_s_per_byte=host)
        # Sequential (the GPU worker: the whole KV exported after the prefill, then sent, then imported).
        _, [request] = run(overlap_layers=False, **common)
        self.assertAlmostEqual(request.first_token - request.arrival, 0.1 + 0.1 + 0.2 + 0.05, places=9)
        self.assertAlmostEqual(request.last_token - request.first_token, 2 * 0.02, places=9)
        # The first token out when the KV has arrived (slimkv before 539a363): before the import, which
        # its TPOT then holds.
        _, [request] = run(overlap_layers=False, first_token_on_arrival=True, **common)
        self.assertAlmostEqual(request.first_token - request.arrival, 0.1 + 0.1 + 0.2, places=9)
        self.assertAlmostEqual(request.last_token - request.first_token, 0.05 + 2 * 0.02, places=9)
        # Layer by layer: each layer computed and exported in 20 ms, sent in 20 ms: the last one leaves at
        # 0.2 s and arrives 20 ms later; then the import.
        _, [request] = run(**common)
        self.assertAlmostEqual(request.first_token - request.arrival, 0.2 + 0.02 + 0.05, places=9)
        # A link slower than the hosts (1 Gbit/s: 0.8 s) paces it; the hosts' 2 ns/B run beside it.
        _, [request] = run(overlap_layers=False, **dict(common, link_gbps=1))
        self.assertAlmostEqual(request.first_token - request.arrival, 0.1 + 0.1 + 0.8 + 0.05, places=9)
        # stream_then_pace (as slimkv's GPU TCP path measures): the hosts' 0.2 s, then the
        # link's 0.8 s; layer by layer each 1e7-byte layer takes 0.02 + 0.08 s, the first ready at 0.02 s.
        _, [request] = run(overlap_layers=False, stream_then_pace=True, **dict(common, link_gbps=1))
        self.assertAlmostEqual(request.first_token - request.arrival, 0.1 + 0.1 + 0.2 + 0.8 + 0.05, places=9)
        _, [request] = run(stream_then_pace=True, **dict(common, link_gbps=1))
        self.assertAlmostEqual(request.first_token - request.arrival, 0.02 + 10 * (0.02 + 0.08) + 0.05, places=9)
        # An import runs at the decode worker's step boundary: a request decoding there waits for it.
        _, requests = run(**dict(common, num_requests=2, output_tokens=[50], requests=[[0.0, 1000, 50], [0.3, 1000, 50]],
                                 overlap_layers=False))
        # The first decodes from 0.45 s a step every 20 ms; the second's KV arrives at 0.7 s (prefill from
        # 0.3 s, export, stream) and is imported at the boundary at 0.71 s: 50 ms during which the first waits.
        alone = 0.1 + 0.1 + 0.2 + 0.05 + 49 * 0.02
        self.assertAlmostEqual(requests[1].first_token, 0.71 + 0.05, places=9)
        self.assertAlmostEqual(requests[0].last_token, alone + 0.05, places=9)
        # Two prompts at once at 1 Gbit/s: the second's transfer (ready 0.2 s after the first's, its
        # prefill and export) queues behind the first's 0.8 s on a shared link; paced per stream
        # (link_shared false, as slimkv's token bucket) it does not.
        both = dict(common, link_gbps=1, overlap_layers=False, requests=[[0.0, 1000, 1], [0.0, 1000, 1]])
        _, requests = run(**both)
        self.assertAlmostEqual(requests[1].first_token - requests[0].first_token, 0.8, places=9)
        _, requests = run(**dict(both, link_shared=False))
        self.assertAlmostEqual(requests[1].first_token - requests[0].first_token, 0.2, places=9)
        with self.assertRaises(ValueError) as raised:
            disagg_sim.Config({"host_path_s_per_byte": {"c": {"export": 1e-9}}})
        self.assertIn("host_path_s_per_byte['c']", str(raised.exception))

    def test_shared_device(self):
        # One prefill and one decode worker; A (100 tokens, 0.1 s of prefill) decodes 10 steps of 20 ms from
        # 0.1 s; B's prefill arrives at 0.15 s, when A's third step is half done.
        common = dict(requests=[[0.0, 100, 11], [0.15, 100, 3]], prefill_s_per_token=1e-3, link_gbps=0, step_base_s=0.02)
        # Apart: B's prefill ends at 0.25 s and B joins at A's next step boundary, 0.26 s; A ends at 0.3 s.
        _, (a, b) = run(**common)
        self.assertAlmostEqual(a.last_token, 0.3, places=9)
        self.assertAlmostEqual(b.first_token, 0.26, places=9)
        # On one device at half speed each while both run: from 0.15 s A's remaining 7.5 steps (0.15 s of
        # work) and B's prefill (0.1 s) progress at half rate, so B's prefill ends at 0.15 + 2 * 0.1 = 0.35 s,
        # when A's eighth step (from 0.33 s) is half done; alone again, it ends at 0.36 s, where B joins.
        # Steps 9 and 10 (both sequences) end at 0.38 and 0.40 s.
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=0.5, **common)
        self.assertAlmostEqual(b.first_token, 0.36, places=9)
        self.assertAlmostEqual(a.last_token, 0.40, places=9)
        self.assertAlmostEqual(b.last_token, 0.40, places=9)
        # A share of 1 (a CPU with a core for each worker's thread) is as apart.
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=1.0, **common)
        self.assertTimes((a.last_token, b.first_token), (0.3, 0.26))
        # An import is the decode worker's work on the device too: 0.05 s for each prompt (1e5 bytes at
        # 0.5 us/B), B's prefill from 0.12 s. Apart: A's import ends at 0.15 s; B's KV is in at 0.22 s and
        # imported at A's boundary at 0.23 s (B's first token at 0.28 s), A's last six steps after it.
        imports = dict(common, requests=[[0.0, 100, 11], [0.12, 100, 3]],
                       host_path_s_per_byte={"c": {"export": 0.0, "stream": 0.0, "import": 5e-7}})
        _, (a, b) = run(**imports)
        self.assertTimes((a.first_token, b.first_token, a.last_token), (0.15, 0.28, 0.4))
        # Shared: A's import (0.03 s left at 0.12 s) and B's prefill run at half speed: A's import ends at
        # 0.18 s, B's prefill (0.07 s left) at 0.32 s, half way through A's fourth step, which ends at 0.33
        # s; B's import then runs alone (first token 0.38 s), and A's six steps after it end at 0.5 s.
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=0.5, **imports)
        self.assertTimes((a.first_token, b.first_token, a.last_token), (0.18, 0.38, 0.5))
        # host_path_on_device false (a GPU's copies and host threads): A's import runs at full speed beside B's
        # prefill (first token 0.15 s, as apart); B's prefill (0.07 s left) and A's steps then share the GPU
        # at half speed: B's prefill ends at 0.29 s, half way through A's fourth step (from 0.27 s), which ends
        # at 0.30 s; B's import, alone, gives its first token at 0.35 s, and A's last six steps end at 0.47 s.
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=0.5, host_path_on_device=False, **imports)
        self.assertTimes((a.first_token, b.first_token, a.last_token), (0.15, 0.35, 0.47))
        # A prefill whose export is half its work (0.1 s of compute, 0.1 s of export) is slowed by the other's
        # steps on its compute share alone: both progress at 1 / (1 + 0.5) while B's prefill (from 0.2 s, when
        # A's ends) and A's steps run: B's ends at 0.2 + 0.2 * 1.5 = 0.5 s, with A's tenth step of 30 ms;
        # with the export on the device too both run at half speed: 0.6 s.
        exports = dict(common, requests=[[0.0, 100, 11], [0.12, 100, 3]],
                       host_path_s_per_byte={"c": {"export": 1e-6, "stream": 0.0, "import": 0.0}})
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=0.5, host_path_on_device=False, **exports)
        self.assertTimes((a.first_token, b.first_token, a.last_token), (0.2, 0.5, 0.5))
        _, (a, b) = run(shared_devices=[[0, 0]], device_share=0.5, **exports)
        self.assertTimes((a.first_token, b.first_token, a.last_token), (0.2, 0.6, 0.6))
        for values, message in (({"shared_devices": [[1, 0]]}, "shared_devices[0]: must be [prefill worker in [0, 1)"),
                                ({"shared_devices": [[0, 0], [1, 0]], "prefill_workers": 2},
                                 "shared_devices: a decode worker is in two pairs"),
                                ({"device_share": 0}, "device_share: must be a number in (0, 1]")):
            with self.assertRaises(ValueError) as raised:
                disagg_sim.Config(values)
            self.assertIn(message, str(raised.exception))

    def test_link_burst(self):
        # 1e6 bytes after the prefill at 1 Gbit/s: 8 ms; a token bucket of 250 KB, empty when the stream
        # opened as the prefill started and full by its end, lets the first 250 KB out at once: 6 ms.
        common = dict(num_requests=1, prompt_tokens=[1000], output_tokens=[1], num_layers=10, prefill_s_per_token=1e-4,
                      link_gbps=1, kv_bytes_per_token={"c": 1000})
        _, [request] = run(overlap_layers=False, **common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 0.008, places=9)
        _, [request] = run(overlap_layers=False, link_burst_bytes=250000, **common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 0.006, places=9)
        # Layer by layer, 1e5 bytes every 10 ms: the bucket refills between layers (1.25e6 bytes in 10 ms,
        # up to its 250 KB), so every layer goes out at once and the last arrives as it is computed.
        _, [request] = run(link_burst_bytes=250000, **common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1, places=9)
        _, [request] = run(**common)
        self.assertAlmostEqual(request.last_token - request.arrival, 0.1 + 0.0008, places=9)
        # A stream of its own (link_shared false: slimkv's) after a prefill of 0.1 ms: its bucket holds the
        # 12.5 KB refilled since it opened when the KV is sent, not 250 KB. (A worker's shared link, idle
        # since time 0, is full by the arrival.)
        _, [request] = run(overlap_layers=False, link_burst_bytes=250000, link_shared=False,
                           **dict(common, prefill_s_per_token=1e-7))
        self.assertAlmostEqual(request.last_token - request.arrival, 0.0001 + 0.008 - 12500 * 8e-9, places=9)

    def gpu_run_errors(self):
        # The measured run, both workers on one H100 (jct_one_h100_10g_layers/, session 22: 0.2 and 0.5 req/s),
        # fed only with what that run's --calibrate measured, never fitted to its outcome: each spec's prefill
        # and decode step costs on its own server alone, the GPU TCP host path of a 16K transfer
        # (bench_kv_transport_cuda's uncapped `tcp` rows, host_path.json), the arrivals and lengths and KV bytes
        # per token; each layer sent as the prefill's steps compute it (overlap_layers), each stream paced on
        # its own at the cap (the 256 KiB bucket), the hosts' work and the pacing adding up (stream_then_pace:
        # what a lone FP16 request measures on this path), the first token out when the request joins the decode batch; the two workers
        # time-slice the GPU's kernels (each at half its speed while both run: device_share 1/2, not fitted),
        # not its copies and host threads (host_path_on_device false). Returns {(rate, spec, metric): {model:
        # simulated / measured - 1}}; the models: that one, its workers on two devices, no host path, and the
        # host path as the CPU has it (on the device, overlapping the pacing).
        results = os.path.join(SOURCE_DIR, "docs", "results", "disaggregated", "jct_one_h100_10g_layers")
        with open(os.path.join(results, "serving_10g.json")) as f:
            measured = json.load(f)
        with open(os.path.join(results, "host_path.json")) as f:
            host_path = json.load(f)
        errors = {}
        for run_ in (r for r in measured["runs"] if r["disaggregated"]):
            costs = measured["costs"][run_["spec"]]
            values = {key: costs[key] for key in ("prefill_base_s", "prefill_s_per_token", "prefill_s_per_token2",
                                                  "step_base_s", "step_s_per_seq", "step_s_per_context_token")}
            values.update(link_gbps=10.0, link_shared=False, link_burst_bytes=256 << 10, num_layers=32, max_batch=4,
                          prefill_chunk_tokens=512, overlap_layers=True, shared_devices=[[0, 0]], device_share=0.5,
                          host_path_on_device=False, stream_then_pace=True,
                          kv_bytes_per_token={"m": run_["kv_bytes_per_token"]},
                          host_path_s_per_byte={"m": host_path[run_["spec"]]},
                          requests=[[r["arrival"], r["prompt"], r["output"]] for r in run_["requests"] if r["ok"]])
            models = {"shared GPU": values, "workers apart": dict(values, shared_devices=[]),
                      "shared GPU, link only": dict(values, host_path_s_per_byte={}),
                      "CPU's host path": dict(values, host_path_on_device=True, stream_then_pace=False)}
            predicted = {model: disagg_sim.summarize(disagg_sim.simulate(disagg_sim.Config(v), "m")) for model, v in models.items()}
            for metric, key in (("JCT", "jct"), ("TTFT", "ttft")):
                real = run_["summary"][f"{key}_mean_s"]
                errors[(run_["rate"], run_["spec"], metric)] = {model: p[f"{key}_s"]["mean"] / real - 1
                                                                for model, p in predicted.items()}
        for (rate, spec, metric), error in errors.items():
            print(f"  {rate} req/s {spec:<20} {metric:<5} simulated vs measured: " + ", ".join(f"{m} {e:+.1%}" for m, e in error.items()))
        return errors

    def test_predicts_the_gpu_run_at_10_gbits(self):
        errors = self.gpu_run_errors()
        self.assertEqual({(rate, spec) for rate, spec, _ in errors},
                         {(r, s) for r in (0.2, 0.5) for s in ("dense:dtype=f16", "hack:bits=2,pi=64")})
        for (rate, spec, metric), error in errors.items():
            if metric != "JCT":
                continue  # printed; the bar is the JCT's (FP16's TTFT at 0.5 req/s: +21.6%)
            # Issue 23's bar; and the host path brings the JCT closer (sharing the GPU does for 2-bit, whose
            # prefills are most of its time; FP16's transfer is: apart and shared give about the same).
            self.assertLess(abs(error["shared GPU"]), 0.15, (rate, spec))
            self.assertLess(abs(error["shared GPU"]), abs(error["shared GPU, link only"]), (rate, spec))
            if spec.startswith("hack"):
                self.assertLess(abs(error["shared GPU"]), abs(error["workers apart"]), (rate, spec))

    def test_predicts_the_two_gpu_runs(self):
        # The 1P+1D runs on two H200s at 16K prompts (equal_tpot_x2/16k/: dense at 0.08 req/s, 2-bit at 0.24),
        # fed with costs the same GPU measured alone in the same session (e2e_16k.txt, the code of those
        # runs): a 16K prefill at the bench's one-prompt rate, a decode step as base + per_seq·B fitted on
        # the batches each decode worker ran (dense: one sequence fits its 4 GB budget; 2-bit: seven, fitted
        # on 2+ sequences, its one-sequence step being a since-fixed kernel anomaly), the KV over NVLink at
        # the 204 GB/s the transport bench measured, sent after the prefill (no per-layer hook on the GPU).
        import re
        folder = os.path.join(SOURCE_DIR, "docs", "results", "disaggregated", "equal_tpot_x2", "16k")
        prefill_tokens_per_s, steps = {}, {"dense": [], "hack": []}
        with open(os.path.join(folder, "e2e_16k.txt")) as f:
            for line in f:
                # kv, batch, context, prefill t/s, TTFT ms, vs first, TBT ms (the step)
                row = re.search(r"\s(dense|hack)\s+(\d+)\s+16384\s+(\d+)\s+[\d.]+\s+[\d.]+x\s+([\d.]+)", line)
                if row:
                    kv, batch, prefill, step_ms = row.group(1), int(row.group(2)), float(row.group(3)), float(row.group(4))
                    prefill_tokens_per_s.setdefault(kv, prefill)  # batch 1 comes first: one prompt alone
                    steps[kv].append((batch, step_ms / 1e3))

        def fit(points):  # least squares of step = base + per_seq · batch
            n = len(points)
            mean_b, mean_t = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
            slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum((b - mean_b) ** 2 for b, _ in points)
            return mean_t - slope * mean_b, slope

        errors = {}
        for rate, kv, max_batch in (("0.08", "dense", 1), ("0.24", "hack", 7)):
            with open(os.path.join(folder, f"rate_{rate}.json")) as f:
                measured = next(r for r in json.load(f)["runs"] if r["disaggregated"])
            base, per_seq = fit([p for p in steps[kv] if kv == "dense" or p[0] >= 2])
            values = dict(prefill_base_s=0.0, prefill_s_per_token=1 / prefill_tokens_per_s[kv], prefill_s_per_token2=0.0,
                          step_base_s=base, step_s_per_seq=per_seq, step_s_per_context_token=0.0, link_gbps=204 * 8,
                          link_shared=False, num_layers=32, max_batch=max_batch, overlap_layers=False,
                          kv_bytes_per_token={"m": measured["kv_bytes_per_token"]},
                          requests=[[r["arrival"], r["prompt"], r["output"]] for r in measured["requests"] if r["ok"]])
            predicted = disagg_sim.summarize(disagg_sim.simulate(disagg_sim.Config(values), "m"))
            for metric in ("jct", "tpot"):
                errors[(measured["spec"], metric)] = predicted[f"{metric}_s"]["mean"] / measured["summary"][f"{metric}_mean_s"] - 1
        for (spec, metric), error in errors.items():
            print(f"  two GPUs, {spec:<18} {metric.upper():<5} simulated vs measured: {error:+.1%}")
        for error in (errors[("dense:dtype=f16", "jct")], errors[("hack:bits=2,pi=64", "jct")]):
            self.assertLess(abs(error), 0.15)

    def test_bad_config_named(self):
        for values, message in (({"prefil_workers": 2}, "unknown config keys ['prefil_workers']"),
                                ({"decode_workers": 0}, "decode_workers: must be an integer >= 1"),
                                ({"prompt_tokens": []}, "prompt_tokens: must be a non-empty list")):
            with self.assertRaises(ValueError) as raised:
                disagg_sim.Config(values)
            self.assertIn(message, str(raised.exception))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
