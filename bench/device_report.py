#!/usr/bin/env python3
"""The tables of scripts/device_check.sh's summary.

  device_report.py tests TESTS.xml|TESTS.log   counts and failed tests of a ctest JUnit file
                                              (or of ctest's console log)
  device_report.py bench WEFT.md TORCH.md     joins bench/cuda_bench's table with
                                              bench/torch_cuda_bench.py's

Both benchmark programs print the same markdown table, one row per benchmark:
  | benchmark | unit | value |
with unit TFLOP/s or GB/s (more is faster) or ms (less is faster) and value
n/a where a side could not run it. The joined table gives, for each row,
weft's speed relative to PyTorch's (above 1: weft is faster) and, for
bandwidths, each side's percentage of the device-to-device copy row
("copy") measured in the same run.
"""
import re
import sys
import xml.etree.ElementTree as ET

COPY_ROW = "copy"
MAX_LISTED = 40  # failed tests named in the summary; tests.log has them all


def first_error(text):
    """The first line of a test's output that says what failed (doctest's ERROR lines)."""
    for line in (text or "").splitlines():
        if "ERROR" in line or "error" in line or "what():" in line:
            return line.strip()[:240]
    return ""


def junit_results(path):
    """(name, outcome, first error line) per test of a ctest JUnit file."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        status = case.get("status", "")
        out = "".join(e.text or "" for e in case.iter("system-out"))
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None or status == "fail":
            message = failure.get("message", "") if failure is not None else ""
            results.append((name, "failed", first_error(out) or message))
        elif case.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped = case.find("skipped")
            message = skipped.get("message", "") if skipped is not None else ""
            # A skip (exit 77) says so; anything else kept the test from running at all.
            results.append((name, "skipped" if "SKIP_RETURN_CODE" in message else "not run", message))
        else:
            results.append((name, "passed", ""))
    return results


LOG_LINE = re.compile(r"Test\s+#\d+: (.*?)\s*\.*\s*(?:\*\*\*)?(Not Run|Exit code \d+|Subprocess aborted|\w+)\s+[\d.]+ sec")


def log_results(path):
    """The same from ctest's console log (when it was stopped before writing the JUnit file)."""
    results = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LOG_LINE.search(line)
            if not m:
                continue
            name, word = m.group(1).strip(), m.group(2)
            if word == "Passed":
                results.append((name, "passed", ""))
            elif word == "Skipped":
                results.append((name, "skipped", ""))
            elif word == "Not Run":
                results.append((name, "not run", ""))
            else:
                results.append((name, "failed", word))
    return results


def tests(path):
    try:
        results = junit_results(path) if path.endswith(".xml") else log_results(path)
    except (OSError, ET.ParseError) as e:
        print(f"no test results: could not read {path}: {e}")
        return
    if not results:
        print(f"no test results in {path}")
        return
    by = {k: [r for r in results if r[1] == k] for k in ("passed", "failed", "skipped", "not run")}
    source = "" if path.endswith(".xml") else " (from the console log: ctest did not finish)"
    print(f"{len(results)} tests: {len(by['passed'])} passed, {len(by['failed'])} failed, "
          f"{len(by['skipped'])} skipped, {len(by['not run'])} not run{source}")
    if by["failed"]:
        print()
        print("Failed:")
        for name, _, why in by["failed"][:MAX_LISTED]:
            print(f"- {name}" + (f": `{why}`" if why else ""))
        if len(by["failed"]) > MAX_LISTED:
            print(f"- ... and {len(by['failed']) - MAX_LISTED} more (tests.log)")
    if by["not run"]:
        print()
        print("Not run (their binary was not built):")
        for name, _, why in by["not run"][:MAX_LISTED]:
            print(f"- {name}" + (f": {why}" if why else ""))
        if len(by["not run"]) > MAX_LISTED:
            print(f"- ... and {len(by['not run']) - MAX_LISTED} more (tests.log)")
    if by["skipped"]:
        names = [r[0] for r in by["skipped"]]
        print()
        print(f"Skipped (no device?): {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}")


def read_table(path):
    """Rows of a benchmark table in order: name -> (unit, value or None)."""
    rows = {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return rows
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("benchmark", "") or set(cells[0]) <= set("-: "):
            continue
        name, unit, value = cells
        try:
            rows[name] = (unit, float(value))
        except ValueError:
            rows[name] = (unit, None)
    return rows


def fmt(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"


def bench(weft_path, torch_path):
    weft = read_table(weft_path)
    torch = read_table(torch_path)
    if not weft and not torch:
        print("no benchmark results (bench.log says why)")
        return
    weft_copy = weft.get(COPY_ROW, (None, None))[1]
    torch_copy = torch.get(COPY_ROW, (None, None))[1]
    print("| benchmark | unit | weft | torch | weft speed / torch | weft % of copy | torch % of copy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    names = list(weft) + [n for n in torch if n not in weft]
    for name in names:
        unit = (weft.get(name) or torch.get(name))[0]
        w = weft.get(name, (unit, None))[1]
        t = torch.get(name, (unit, None))[1]
        ratio = None
        if w and t:
            ratio = t / w if unit == "ms" else w / t
        wc = tc = ""
        if unit == "GB/s":
            wc = fmt(100 * w / weft_copy, 0) if w and weft_copy else "n/a"
            tc = fmt(100 * t / torch_copy, 0) if t and torch_copy else "n/a"
        print(f"| {name} | {unit} | {fmt(w)} | {fmt(t)} | {fmt(ratio)} | {wc} | {tc} |")


def main(argv):
    if len(argv) == 3 and argv[1] == "tests":
        tests(argv[2])
    elif len(argv) == 4 and argv[1] == "bench":
        bench(argv[2], argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
