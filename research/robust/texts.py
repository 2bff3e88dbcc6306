"""Effective sentences and z of generated texts: ``python -m research.robust.texts GEN.jsonl ...``.

For each generation file (``watermark.py generate --input`` records) the texts are detected with
the key in ``KSEMSTAMP_KEY`` under the default settings (or ``--config`` files), and per text
the number of scored sentences, the effective number ``N^2 / V`` (``V`` the null variance of
the score sum, key-free), the mean score, the z and the p-value are summarised.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ksemstamp.builders import build_detector, build_scheme
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings_files import load_watermark_settings

from .common import read_jsonl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--config", action="append", default=[])
    a = p.parse_args()
    cfg = load_watermark_settings(a.config) if a.config else WatermarkSettings()
    cfg.allow_weak_key = True
    scheme = build_scheme(cfg)
    det = build_detector(cfg, scheme)
    for path in a.files:
        rows = [r for r in read_jsonl(path) if r.get("status") == "ok"]
        res = det.detect_batch([r["text"] for r in rows], prompts=[r["prompt"] for r in rows])
        n, neff, mean, zs, ps = [], [], [], [], []
        for r in res:
            s = [x for x in r.scores if x is not None]
            if not s or r.z_score is None:
                continue
            var = (sum(s) / r.z_score) ** 2
            n.append(len(s))
            neff.append(len(s) ** 2 / var)
            mean.append(float(np.mean(s)))
            zs.append(r.z_score)
            ps.append(r.p_value)
        share = np.array(neff) / np.array(n)
        print(
            json.dumps(
                {
                    "file": path,
                    "texts": len(n),
                    "median_n": float(np.median(n)),
                    "median_neff": round(float(np.median(neff)), 2),
                    "median_share": round(float(np.median(share)), 3),
                    "mean_score": round(float(np.mean(mean)), 3),
                    "median_z": round(float(np.median(zs)), 2),
                    "min_z": round(float(np.min(zs)), 2),
                    "detected_1pct": float(np.mean(np.array(ps) <= 0.01)),
                }
            )
        )


if __name__ == "__main__":
    main()
