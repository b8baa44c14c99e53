"""The test runner uploaded into a sandbox next to the model's solution.

:data:`HARNESS` is the source of ``run_tests.py``, a standard-library-only script
that reads ``tests.json`` (``{"tests": [{"input": ..., "output": ...}], "fn_name":
..., "timeout": ...}``), runs every test in its own subprocess with a time limit,
and prints one JSON line per test: ``{"passed": bool, "time_s": float, "status":
"ok" | "wrong" | "timeout" | "error"}``. Two styles:

- standard input / output (no ``fn_name``): ``python3 solution.py`` with the input
  on stdin; the output matches when the whitespace-separated tokens are equal
  (numbers within 1e-6);
- call-based (``fn_name`` set): the input is a JSON list of arguments (or one
  argument per line, each JSON), the function (or ``Solution().fn_name``) is called
  and its return value compared to the JSON output.

It runs inside the sandbox, so the sandbox's limits and cleanup apply to it and to
every test process.
"""

HARNESS = r'''
import json, math, subprocess, sys, time

def tokens_equal(got, want):
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6):
                continue
        except ValueError:
            pass
        return False
    return True

CALL = """
import json, sys
sys.setrecursionlimit(100000)
ns = {"__name__": "solution"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
fn_name = sys.argv[1]
raw = sys.stdin.read()
try:
    args = json.loads(raw)
    if not isinstance(args, list):
        args = [args]
except ValueError:
    args = [json.loads(line) for line in raw.splitlines() if line.strip()]
fn = ns[fn_name] if fn_name in ns else getattr(ns["Solution"](), fn_name)
print(json.dumps(fn(*args)))
"""

def main():
    spec = json.load(open("tests.json"))
    fn_name = spec.get("fn_name")
    timeout = float(spec.get("timeout", 10))
    for test in spec["tests"]:
        argv = [sys.executable, "solution.py"] if not fn_name else [sys.executable, "-c", CALL, fn_name]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, input=test["input"], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(json.dumps({"passed": False, "time_s": time.perf_counter() - t0, "status": "timeout"}), flush=True)
            continue
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            status, passed = "error", False
        elif fn_name:
            try:
                passed = json.loads(proc.stdout.strip().splitlines()[-1]) == json.loads(test["output"])
            except (ValueError, IndexError):
                passed = tokens_equal(proc.stdout, test["output"])
            status = "ok" if passed else "wrong"
        else:
            passed = tokens_equal(proc.stdout, test["output"])
            status = "ok" if passed else "wrong"
        print(json.dumps({"passed": passed, "time_s": elapsed, "status": status}), flush=True)

main()
'''
