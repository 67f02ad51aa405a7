"""scripts/disagg_sim.py against answers known in closed form: one request alone (prefill, the layer-
pipelined transfer, decode steps), the transfer time of a bandwidth-bound prompt, batch-dependent TPOT,
and the prefill worker as an M/D/1 queue (Pollaczek-Khinchine mean wait). Usage: disagg_sim_test.py SOURCE_DIR"""
import os
import sys
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
import disagg_sim  # noqa: E402


def run(codec="c", **values):
    values.setdefault("kv_bytes_per_token", {"c": 1000})
    config = disagg_sim.Config(values)
    return config, disagg_sim.simulate(config, codec)


class DisaggSimTest(unittest.TestCase):
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

    def test_bad_config_named(self):
        for values, message in (({"prefil_workers": 2}, "unknown config keys ['prefil_workers']"),
                                ({"decode_workers": 0}, "decode_workers: must be an integer >= 1"),
                                ({"prompt_tokens": []}, "prompt_tokens: must be a non-empty list")):
            with self.assertRaises(ValueError) as raised:
                disagg_sim.Config(values)
            self.assertIn(message, str(raised.exception))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
