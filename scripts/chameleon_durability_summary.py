"""Table of scripts/chameleon_durability.py outputs (JSON lines): mean±sd over seeds per configuration."""
import json, sys, statistics as st, glob
rows = {}
for f in sys.argv[1:]:
    for l in open(f):
        try: r = json.loads(l)
        except Exception: continue
        if len(r["asr"]) != 50: continue
        rows.setdefault(r["cfg"], {})[r["seed"]] = r
def ms(v): return f"{st.mean(v):.2f}±{st.pstdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"
print(f"{'config':16s} seeds  acc@29     ASR@29     ASR@39     ASR@49     keep@39    life(0.5)  mean(30-49)")
for cfg, by in rows.items():
    rs = [by[s] for s in sorted(by)]
    end = [r["asr"][29] for r in rs]; a10 = [r["asr"][39] for r in rs]; a20 = [r["asr"][49] for r in rs]
    keep = [b / a if a > 0 else 0 for a, b in zip(end, a10)]
    life = [r["d50"]["backdoor_lifespan"] for r in rs]
    mean = [st.mean(r["asr"][30:50]) for r in rs]
    acc = [r["acc"][29] for r in rs]
    print(f"{cfg:16s} {len(rs):5d}  {ms(acc):9s}  {ms(end):9s}  {ms(a10):9s}  {ms(a20):9s}  {ms(keep):9s}  "
          f"{'/'.join(str(x) for x in life):9s}  {ms(mean)}")
