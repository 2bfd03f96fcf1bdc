"""deploy/prometheus: the rules pass promtool's checks and their unit tests, and the unit tests
cover every alert and notice a broken rule."""
import shutil
import subprocess

import yaml

from deploy_assets import require_tool
from deploy_assets import ADAPTER_VALUES, RULE_TESTS, RULES, alert_rules, recording_rules

REQUIRED_ALERTS = {  # the list, by what each watches
    "AttnserveHighErrorRatio",    # error ratio
    "AttnserveHighP99Latency",    # p99 latency
    "AttnserveQueueSaturated",    # queue saturation
    "AttnserveQueueTimeHigh",
    "AttnserveDeviceMemoryHigh",  # device memory
    "AttnserveNoGpuDevices",      # no GPU devices
}


def promtool(*args, cwd=None):
    return subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_promtool_check_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules()) + len(recording_rules())} rules found" in result.stdout


def test_promtool_rule_unit_tests_pass():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])
             if case["exp_alerts"]}
    assert REQUIRED_ALERTS <= set(alert_rules())
    assert set(alert_rules()) == fired, "alerts without a firing unit test"


def test_alerts_are_routable_and_explained():
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                assert rule["record"].count(":") == 2, f"{rule['record']}: level:metric:ops"
                continue
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert rule.get("for"), f"{rule['alert']} would fire on one bad evaluation"


def test_unit_tests_notice_a_broken_threshold(tmp_path):
    """The same unit tests against rules whose error-ratio threshold is 10x too high fail."""
    broken = RULES.read_text().replace("job:attnserve_request_errors:ratio_rate5m > 0.05",
                                       "job:attnserve_request_errors:ratio_rate5m > 0.5")
    assert broken != RULES.read_text()
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    result = promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    assert result.returncode != 0
    assert "AttnserveHighErrorRatio" in result.stdout + result.stderr


def test_adapter_values_parse():
    custom = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    for rule in custom:
        assert {"seriesQuery", "resources", "name", "metricsQuery"} <= set(rule)
        overrides = rule["resources"]["overrides"]
        assert overrides["namespace"] == {"resource": "namespace"}
        assert overrides["pod"] == {"resource": "pod"}
