"""deploy/helm/attnserve, rendered by Helm's own engine (helm-python-sdk: Helm v4's Go SDK
through ctypes) and validated against Kubernetes' JSON schemas (kubernetes-validate, which
bundles them)."""
import re

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from deploy_assets import CHART, DOCKERFILE, adapter_metric_names
from security_pki import SecureServerProcess, https_context, make_pki
from server_process import ServerProcess

RELEASE, NAMESPACE = "gpu", "ml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema set.
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# Every feature on, as a platform team running the Prometheus Operator would set it.
FULL = {
    "gpu": {"count": 2, "selector": {"computeCapabilities": ["7.5", "8.6"],
                                     "products": ["Tesla-T4", "NVIDIA-A10"],
                                     "minComputeMajor": 7}},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
    "server": {"drainTimeoutSeconds": 45, "extraArgs": ["--http_threads=2"]},
}
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


def render(values=None, name=RELEASE):
    """{template path: text} for the chart with these values."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=name, namespace=NAMESPACE)


def manifests(values=None):
    """The rendered Kubernetes objects."""
    objects = []
    for path, text in render(values).items():
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind):
    found = by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(objects):
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def flag_values(args):
    """--name=value arguments as a dict (the last of a repeated flag wins, as in absl)."""
    values = {}
    for arg in args:
        match = re.fullmatch(r"--([a-z_]+)=(.*)", arg)
        assert match, f"argument {arg!r} is not --flag=value"
        values[match.group(1)] = match.group(2)
    return values


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def test_lint_strict_is_clean():
    examples = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    assert len(examples) >= 3
    for values in [None, FULL] + examples:
        report = helm.lint(CHART, values, strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], report


def test_default_render_kinds():
    kinds = sorted(o["kind"] for o in manifests())
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"]


def test_full_render_kinds():
    kinds = sorted(o["kind"] for o in manifests(FULL))
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service",
                     "Service", "ServiceAccount", "ServiceMonitor"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", ["default", "full"] + [p.name for p in EXAMPLES])
def test_manifests_validate_against_kubernetes_schemas(case, kube_version):
    values = {"default": None, "full": FULL}.get(case)
    if values is None and case != "default":
        values = yaml.safe_load((CHART / "examples" / case).read_text())
    checked = []
    for obj in manifests(values):
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD, not in Kubernetes' schemas: test_service_monitor_* checks it
        # strict: unknown fields are errors, as the API server's strict field validation.
        kubernetes_validate.validate(obj, kube_version, strict=True)
        checked.append(obj["kind"])
    assert {"Deployment", "Service", "ServiceAccount"} <= set(checked)


def test_gpu_limit_and_node_affinity():
    objects = manifests(FULL)
    assert container(objects)["resources"]["limits"]["nvidia.com/gpu"] == 2
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    # One term per compute capability (terms are ORed), each also requiring the products.
    assert len(terms) == 2
    found = set()
    for term in terms:
        expressions = {(e["key"], e["operator"]): e["values"] for e in term["matchExpressions"]}
        assert expressions[("nvidia.com/gpu.present", "In")] == ["true"]
        assert expressions[("nvidia.com/gpu.product", "In")] == ["Tesla-T4", "NVIDIA-A10"]
        assert expressions[("nvidia.com/gpu.compute.major", "Gt")] == ["6"]
        found.add((expressions[("nvidia.com/gpu.compute.major", "In")][0],
                   expressions[("nvidia.com/gpu.compute.minor", "In")][0]))
    assert found == {("7", "5"), ("8", "6")}
    tolerations = pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_cpu_release_has_no_gpu_requirements():
    objects = manifests({"gpu": {"count": 0}})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in container(objects)["resources"].get("limits", {})
    assert "nodeAffinity" not in pod.get("affinity", {})
    assert flag_values(container(objects)["args"])["devices"] == "cpu"


def test_native_grpc_probes():
    c = container(manifests())
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "exec", "tcpSocket"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == grpc_port
    assert c["livenessProbe"]["grpc"]["service"] == ""
    assert c["readinessProbe"]["grpc"]["service"] == "attnserve.v1.AttentionService"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # CUDA init time


def test_termination_grace_covers_prestop_and_drain():
    for values in (None, FULL):
        objects = manifests(values)
        c = container(objects)
        drain = int(flag_values(c["args"])["drain_timeout_seconds"])
        sleep = c["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "/bin/sleep"
        grace = one(objects, "Deployment")["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]
        assert grace == int(sleep[1]) + drain + 5, (grace, sleep, drain)


def test_services_headless_and_cluster_ip():
    objects = manifests()
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert set(services) == {"gpu-attnserve", "gpu-attnserve-headless"}
    headless, cluster_ip = services["gpu-attnserve-headless"], services["gpu-attnserve"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is False
    assert cluster_ip["spec"]["type"] == "ClusterIP" and "clusterIP" not in cluster_ip["spec"]
    for service in services.values():
        assert selects(service["spec"]["selector"], pod_labels)
        grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc["port"] == 8001 and grpc["targetPort"] == "grpc"
    # NOTES tells clients the round_robin target on the headless Service.
    notes = render()["attnserve/templates/NOTES.txt"]
    assert "dns:///gpu-attnserve-headless.ml.svc:8001" in notes
    assert "round_robin" in notes


def test_service_monitor_scrapes_the_cluster_ip_service_only():
    objects = manifests(FULL)
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selected = [s for s in by_kind(objects, "Service")
                if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == ["gpu-attnserve"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["port"] == "http"
    # Scrape annotations would make an annotation-scraping Prometheus scrape twice.
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    assert "prometheus.io/scrape" not in annotations


def test_scrape_annotations_point_at_metrics():
    objects = manifests()
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    http_port = next(p["containerPort"] for p in container(objects)["ports"]
                     if p["name"] == "http")
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(http_port),
                           "prometheus.io/path": "/metrics"}


def test_hpa_scales_the_deployment_on_an_adapter_metric():
    objects = manifests(FULL)
    hpa, deployment = one(objects, "HorizontalPodAutoscaler"), one(objects, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] in adapter_metric_names()
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    # Every metric the schema allows is one the adapter serves.
    with helm.Chart.load(CHART) as chart:
        allowed = chart.schema["properties"]["autoscaling"]["properties"]["metric"][
            "properties"]["name"]["enum"]
    assert set(allowed) <= adapter_metric_names()


def test_pod_disruption_budget_selects_the_pods():
    objects = manifests()
    pdb = one(objects, "PodDisruptionBudget")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)


def test_restrictive_security_context_matches_the_image_user():
    objects = manifests()
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    # The chart's uid is the one the Dockerfile's USER runs as.
    user = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), re.M)
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(user.group(1)), int(user.group(2)))
    # The one writable path, where the image points CUDA's JIT cache.
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert "CUDA_CACHE_PATH=/tmp/" in DOCKERFILE.read_text()


SECURE = {"security": {"tls": {"secretName": "attnserve-tls"},
                       "auth": {"tokensSecretName": "attnserve-tokens"}},
          "metrics": {"serviceMonitor": {"enabled": True,
                                         "tlsConfig": {"serverName": "attnserve"}}}}
MUTUAL = {"security": {"tls": {"secretName": "attnserve-tls",
                               "clientCaSecretName": "attnserve-client-ca"}}}


def test_tls_and_token_secrets_are_mounted_and_passed_as_flags():
    objects = manifests(SECURE)
    c = container(objects)
    flags = flag_values(c["args"])
    assert flags["tls_cert_file"] == "/etc/attnserve/tls/tls.crt"
    assert flags["tls_key_file"] == "/etc/attnserve/tls/tls.key"
    assert flags["auth_tokens_file"] == "/etc/attnserve/auth/tokens"
    assert "tls_client_ca_file" not in flags
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"][
        "volumes"]}
    for directory, secret in (("tls", "attnserve-tls"), ("auth", "attnserve-tokens")):
        mount = mounts[f"/etc/attnserve/{directory}"]
        assert mount["readOnly"] and "subPath" not in mount  # subPath would freeze the file
        assert volumes[mount["name"]]["secret"]["secretName"] == secret
    # The kubelet's gRPC probes cannot speak TLS: HTTPS GETs instead.
    http_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert c["readinessProbe"]["httpGet"] == {"port": http_port, "path": "/readyz",
                                              "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "grpc" not in c["startupProbe"]
    endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"serverName": "attnserve"}
    annotations = manifests({"security": SECURE["security"]})
    pod = one(annotations, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert pod["prometheus.io/scheme"] == "https"


def test_mtls_mounts_the_client_ca_and_probes_by_tcp():
    c = container(manifests(MUTUAL))
    assert flag_values(c["args"])["tls_client_ca_file"] == "/etc/attnserve/client-ca/ca.crt"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "exec", "tcpSocket"} == {"tcpSocket"}, probe


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", [SECURE, MUTUAL], ids=["tls_tokens", "mtls"])
def test_secure_manifests_validate_against_kubernetes_schemas(values, kube_version):
    for obj in manifests(values):
        if not obj["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("bad", [
    {"replicas": 3},                                        # a typo of replicaCount
    {"server": {"grpcPort": "8001x"}},
    {"server": {"devices": "gpu0"}},
    {"gpu": {"selector": {"computeCapabilities": ["8"]}}},  # needs major.minor
    {"autoscaling": {"metric": {"name": "cpu"}}},           # not an adapter metric
    {"security": {"tls": {"clientCaSecretName": "ca"}}},     # mTLS without TLS
    {"security": {"auth": {"tokensSecretName": "Bad_Name"}}},
])
def test_schema_rejects_bad_values(bad):
    with pytest.raises(helm.HelmError):
        render(bad)


def test_replicas_advertise_their_pod_address_for_saved_contexts():
    """Each pod names itself (status.podIP and the gRPC port) in --advertise_address, so a
    context's backward reaches the replica that keeps it; off, neither the flag nor the
    variable is set."""
    spec = container(manifests())
    flags = flag_values(spec["args"])
    assert flags["advertise_address"] == "$(ATTNSERVE_POD_IP):8001"
    assert flags["context_ttl_seconds"] == "300" and flags["context_memory_bytes"] == "0"
    env = {e["name"]: e for e in spec["env"]}
    assert env["ATTNSERVE_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    spec = container(manifests({"server": {"advertisePodAddress": False}}))
    assert "advertise_address" not in flag_values(spec["args"])
    assert "env" not in spec


def test_chart_args_are_accepted_by_the_server(attnserve_binary):
    """The container's arguments start the real server (host, ports and devices replaced by
    local ones; every other flag as rendered)."""
    flags = flag_values(container(manifests(FULL))["args"])
    assert flags.pop("host") == "0.0.0.0"
    assert flags.pop("grpc_port") == "8001" and flags.pop("http_port") == "8000"
    assert flags.pop("devices") == "auto"
    assert {"drain_timeout_seconds", "max_message_bytes", "max_total_tokens"} <= set(flags)
    assert flags["max_request_compute_seconds"] == "30"
    server = ServerProcess(attnserve_binary, flags).start()
    assert server.stop() == 0, server.log()


def test_secure_chart_args_are_accepted_by_the_server(attnserve_binary, tmp_path):
    """The TLS, mTLS and token arguments start the real server, with the Secrets' mount paths
    pointed at throwaway files."""
    pki = make_pki(tmp_path)
    (tmp_path / "tokens").write_text("chart-test-token\n")
    local = {"/etc/attnserve/tls/tls.crt": pki.server_cert,
             "/etc/attnserve/tls/tls.key": pki.server_key,
             "/etc/attnserve/client-ca/ca.crt": pki.ca,
             "/etc/attnserve/auth/tokens": str(tmp_path / "tokens")}
    values = {"security": {"tls": MUTUAL["security"]["tls"],
                           "auth": SECURE["security"]["auth"]}}
    flags = flag_values(container(manifests(values))["args"])
    for name in ("host", "grpc_port", "http_port", "devices"):
        flags.pop(name)
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "auth_tokens_file"):
        flags[name] = local[flags[name]]
    server = SecureServerProcess(flags, https_context(pki.ca, pki.client_cert, pki.client_key),
                                 "chart-test-token").start()
    assert server.request("/v1/info")[0] == 200
    assert server.stop() == 0, server.log()
