import sys, time, json
root = sys.argv[1]; sys.path.insert(0, root)
from spak.cpu import host_cost as hc
from spak import api
api.STORE_RECHECK_S = 1e9
out = {}
with hc.fake_cuda():
    for name, fn in hc.cases().items():
        fn(); fn()
        calls = hc.count_calls(fn); allc = hc.count_calls(fn, where="")
        dev = hc.device_calls(fn)
        cpu = hc.per_call_us(fn, 1000, clock=time.process_time)
        out[name] = dict(cpu_us=round(cpu, 1), calls=calls, calls_anywhere=allc, **dev,
                         est_gpu_host_us=round(cpu + dev["gpu_us"], 1))
print(json.dumps(out))
