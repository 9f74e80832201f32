//! The deployment artefacts kept true against the real thing: the Helm chart
//! rendered by helm, the compose file's nodes started as processes, the
//! dashboard's and alerts' metrics present on a node, and a real Prometheus
//! scraping a three-node cluster.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{eventually, http_get, LocalNode, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::StreamActivatedJobsRequest;
use serde_yaml::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn tool(name: &str) -> PathBuf {
    let dir = std::env::var("DROVER_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/drover-tools/bin"));
    let candidate = dir.join(name);
    if candidate.exists() {
        return candidate;
    }
    PathBuf::from(name)
}

fn run(mut command: Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e} (run scripts/setup.sh)"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml).map(|d| Value::deserialize(d).unwrap()).filter(|v| !v.is_null()).collect()
}

use serde::Deserialize;

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
}

fn env_of<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"].as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))?["value"].as_str()
}

#[test]
fn helm_chart_renders_a_consistent_cluster_for_1_3_and_5_nodes() {
    let helm = tool("helm");
    let chart = repo("helm/drover");
    let mut lint = Command::new(&helm);
    lint.arg("lint").arg(&chart);
    run(lint);
    for size in [1usize, 3, 5] {
        let rf = size.min(3);
        let mut template = Command::new(&helm);
        template
            .args(["template", "drover", "--namespace", "jobs"])
            .arg(&chart)
            .args(["--set", &format!("clusterSize={size},replicationFactor={rf},serviceMonitor.enabled=true")])
            .args(["--set", "tls.enabled=false"]);
        let docs = documents(&run(template));

        let headless: Vec<&Value> =
            kind(&docs, "Service").into_iter().filter(|s| s["spec"]["clusterIP"].as_str() == Some("None")).collect();
        assert_eq!(headless.len(), 1, "one headless Service");
        let headless = headless[0];
        assert_eq!(headless["spec"]["publishNotReadyAddresses"].as_bool(), Some(true));
        let headless_name = headless["metadata"]["name"].as_str().unwrap();

        let sets = kind(&docs, "StatefulSet");
        assert_eq!(sets.len(), 1);
        let set = sets[0];
        let set_name = set["metadata"]["name"].as_str().unwrap();
        assert_eq!(set["spec"]["replicas"].as_u64(), Some(size as u64));
        assert_eq!(
            set["spec"]["serviceName"].as_str(),
            Some(headless_name),
            "pods get DNS names under the headless Service"
        );
        assert_eq!(set["spec"]["podManagementPolicy"].as_str(), Some("Parallel"));
        let pod = &set["spec"]["template"]["spec"];
        let container = &pod["containers"][0];

        let members: Vec<&str> = env_of(container, "DROVER_MEMBERS").unwrap().split(',').collect();
        assert_eq!(members.len(), size, "the member list has clusterSize entries");
        for (i, member) in members.iter().enumerate() {
            assert_eq!(*member, format!("{i}={set_name}-{i}.{headless_name}.jobs.svc:26502"), "member {i}");
        }
        assert_eq!(env_of(container, "DROVER_NODE_ID_FROM_HOSTNAME"), Some("true"), "node id from the pod ordinal");
        assert_eq!(env_of(container, "DROVER_REPLICATION_FACTOR"), Some(rf.to_string().as_str()));
        // The node id derivation: pod names are <statefulset>-<ordinal>.
        let config = drover::config::ServeArgs {
            node_id_from_hostname: Some(true),
            members: Some(members.iter().map(|m| m.to_string()).collect()),
            replication_factor: Some(rf as u32),
            ..Default::default()
        };
        // SAFETY of the test: HOSTNAME is only read by this call, in this test process.
        unsafe { std::env::set_var("HOSTNAME", format!("{set_name}-{}", size - 1)) };
        assert_eq!(config.resolve().unwrap().node_id, (size - 1) as u64);

        let ports: Vec<(&str, u64)> = container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_u64().unwrap()))
            .collect();
        let admin_port = ports.iter().find(|(n, _)| *n == "admin").unwrap().1;
        assert_eq!(env_of(container, "DROVER_ADMIN_ADDR"), Some(format!("0.0.0.0:{admin_port}").as_str()));
        assert_eq!(env_of(container, "DROVER_TLS_CERT"), None, "tls.enabled=false opts out of TLS");
        assert_eq!(container["readinessProbe"]["httpGet"]["scheme"].as_str(), Some("HTTP"));
        assert_eq!(container["readinessProbe"]["httpGet"]["path"].as_str(), Some("/ready"));
        assert_eq!(container["readinessProbe"]["httpGet"]["port"].as_str(), Some("admin"));
        assert_eq!(container["livenessProbe"]["httpGet"]["path"].as_str(), Some("/health"));
        assert_eq!(container["livenessProbe"]["httpGet"]["port"].as_str(), Some("admin"));

        let pdbs = kind(&docs, "PodDisruptionBudget");
        assert_eq!(pdbs.len(), 1);
        assert_eq!(pdbs[0]["spec"]["maxUnavailable"].as_u64(), Some(1), "at most one node down");
        let anti = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(anti["topologyKey"].as_str(), Some("kubernetes.io/hostname"));
        assert_eq!(anti["labelSelector"]["matchLabels"], set["spec"]["selector"]["matchLabels"]);
        assert_eq!(kind(&docs, "ServiceMonitor").len(), 1);
        assert!(set["spec"]["volumeClaimTemplates"].as_sequence().is_some_and(|v| !v.is_empty()));
    }
}

#[test]
fn helm_chart_grows_a_cluster_through_the_plan_keeping_the_member_list_it_formed_with() {
    let mut template = Command::new(tool("helm"));
    template
        .args(["template", "drover", "--namespace", "jobs"])
        .arg(repo("helm/drover"))
        .args(["--set", "clusterSize=5,formedSize=3,tls.enabled=false,membership.token.secretName=admin"]);
    let docs = documents(&run(template));
    let set = kind(&docs, "StatefulSet")[0];
    assert_eq!(set["spec"]["replicas"].as_u64(), Some(5));
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let members: Vec<&str> = env_of(container, "DROVER_MEMBERS").unwrap().split(',').collect();
    assert_eq!(members.len(), 3, "pods keep the member list the cluster formed with: no restart, no refusal");
    assert_eq!(env_of(container, "DROVER_JOIN_IF_UNLISTED"), Some("true"), "pods 3 and 4 join the running cluster");
    let jobs = kind(&docs, "Job");
    let hooks: Vec<&str> =
        jobs.iter().map(|j| j["metadata"]["annotations"]["helm.sh/hook"].as_str().unwrap()).collect();
    assert_eq!(hooks, ["pre-upgrade", "post-upgrade"]);
    for job in &jobs {
        let hook = job["metadata"]["annotations"]["helm.sh/hook"].as_str().unwrap();
        let container = &job["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(&args[..4], ["cluster", "scale", "--size", "5"]);
        let template = args[args.iter().position(|a| *a == "--address-template").unwrap() + 1];
        assert_eq!(template, "drover-{id}.drover-headless.jobs.svc:26502", "the members' addresses, by ordinal");
        assert_eq!(args.contains(&"--remove-only"), hook == "pre-upgrade", "only removals before the set shrinks");
        assert!(env_of(container, "DROVER_TOKEN").is_none(), "the token comes from the Secret");
        assert_eq!(container["env"][1]["valueFrom"]["secretKeyRef"]["name"].as_str(), Some("admin"));
    }
    // The arguments parse as the CLI takes them.
    let help = std::process::Command::new(common::drover_bin()).args(["cluster", "scale", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--address-template"));
}

#[test]
fn helm_chart_adds_partitions_after_the_pods_are_up_only_when_the_target_is_above_the_count() {
    let render = |set: &str| {
        let mut template = Command::new(tool("helm"));
        template.args(["template", "drover", "--namespace", "jobs"]).arg(repo("helm/drover")).args(["--set", set]);
        documents(&run(template))
    };
    let names = |docs: &[Value]| -> Vec<String> {
        kind(docs, "Job").iter().map(|j| j["metadata"]["name"].as_str().unwrap().to_string()).collect()
    };
    let unchanged = render("tls.enabled=false,partitionsTarget=3");
    assert!(!names(&unchanged).iter().any(|n| n.ends_with("-partitions")), "{:?}", names(&unchanged));
    let docs = render("tls.enabled=false,partitionsTarget=6");
    let jobs = kind(&docs, "Job");
    let job = jobs.iter().find(|j| j["metadata"]["name"].as_str().unwrap().ends_with("-partitions")).expect("a job");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"].as_str(), Some("post-upgrade"));
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(&args[..4], ["cluster", "add-partitions", "--to", "6"]);
    let set = kind(&docs, "StatefulSet")[0];
    let pod = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(pod, "DROVER_PARTITIONS"), Some("3"), "pods keep the count the cluster formed with");
    let help = std::process::Command::new(common::drover_bin()).args(["cluster", "add-partitions", "--help"]).output();
    assert!(String::from_utf8_lossy(&help.unwrap().stdout).contains("--wait"));
}

#[test]
fn helm_chart_schedules_backups_into_a_named_claim_or_a_bucket_when_asked() {
    let helm = tool("helm");
    let chart = repo("helm/drover");
    let render = |set: &str| {
        let mut template = Command::new(&helm);
        template.args(["template", "drover", "--namespace", "jobs"]).arg(&chart).args(["--set", set]);
        documents(&run(template))
    };
    assert!(kind(&render("backup.enabled=false"), "CronJob").is_empty(), "no backups unless asked");

    let docs = render("backup.enabled=true,backup.claimName=drover-backups,backup.token.secretName=backup-token");
    let jobs = kind(&docs, "CronJob");
    assert_eq!(jobs.len(), 1);
    let spec = &jobs[0]["spec"];
    assert_eq!(spec["concurrencyPolicy"].as_str(), Some("Forbid"), "one backup at a time");
    let pod = &spec["jobTemplate"]["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["backup", "create", "--to", "/backups"]);
    assert_eq!(env_of(container, "DROVER_ADDRESS"), Some("https://drover.jobs.svc:26500"));
    assert_eq!(env_of(container, "DROVER_TLS_CA"), Some("/etc/drover/tls/ca.crt"));
    assert_eq!(pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].as_str(), Some("drover-backups"));
    // The backup pod is no node: no Service or disruption budget selects it.
    let set = kind(&docs, "StatefulSet")[0];
    assert_ne!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        set["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
    );

    let mut unnamed = Command::new(&helm);
    unnamed.args(["template", "drover"]).arg(&chart).args(["--set", "backup.enabled=true"]);
    let output = unnamed.output().unwrap();
    assert!(!output.status.success(), "a backup needs a claim to write to");
    assert!(String::from_utf8_lossy(&output.stderr).contains("backup.claimName"));

    // Or a bucket: no volume, the credentials from a Secret.
    let docs = render(
        "backup.enabled=true,backup.s3.url=s3://acme/prod,backup.s3.secretName=s3-keys,backup.s3.region=eu-west-1",
    );
    let pod = &kind(&docs, "CronJob")[0]["spec"]["jobTemplate"]["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["backup", "create", "--to", "s3://acme/prod"]);
    assert_eq!(container["envFrom"][0]["secretRef"]["name"].as_str(), Some("s3-keys"));
    assert_eq!(env_of(container, "AWS_REGION"), Some("eu-west-1"));
    let volumes = pod["spec"]["volumes"].as_sequence().unwrap();
    assert!(volumes.iter().all(|v| v["persistentVolumeClaim"].is_null()), "no claim for a bucket: {volumes:?}");
    let mut keyless = Command::new(&helm);
    keyless
        .args(["template", "drover"])
        .arg(&chart)
        .args(["--set", "backup.enabled=true,backup.s3.url=s3://acme/prod"]);
    let output = keyless.output().unwrap();
    assert!(!output.status.success() && String::from_utf8_lossy(&output.stderr).contains("backup.s3.secretName"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_paths_exist_on_a_node() {
    let node = LocalNode::start().await;
    let admin = node.node().admin_addr.to_string();
    assert_eq!(http_get(&admin, "/health").await.unwrap().0, 200);
    assert_eq!(http_get(&admin, "/ready").await.unwrap().0, 200);
}

/// Metric names (without histogram suffixes) used in PromQL expressions.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(found) = text[i..].find("drover_") {
        let start = i + found;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        names.insert(base.to_string());
        i = end;
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_dashboard_and_alerts_is_exported() {
    let dashboard = std::fs::read_to_string(repo("deploy/grafana/drover.json")).unwrap();
    let rules = std::fs::read_to_string(repo("deploy/prometheus-rules.yml")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut used = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            used.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    let alert_metrics = metric_names(&rules);
    assert!(alert_metrics.len() >= 3);
    used.extend(alert_metrics);

    let node = LocalNode::start().await;
    // Drive every kind of event once.
    let key = node.client.create_job("ops", "{}").await.unwrap();
    let job = node.client.activate("ops", "w", 1, 60_000, 0).await.unwrap().remove(0);
    node.client.fail(key, job.attempt, 0, "x", 0).await.unwrap();
    let done = node.client.create_job("ops", "{}").await.unwrap();
    let job = node.client.activate("ops", "w", 1, 60_000, 0).await.unwrap().remove(0);
    assert_eq!(job.key, done);
    node.client.complete(job.key, job.attempt, "{}").await.unwrap();
    let _stream = node
        .client
        .raw()
        .stream_activated_jobs(StreamActivatedJobsRequest {
            r#type: "ops2".into(),
            timeout: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    node.client.create_job("ops2", "{}").await.unwrap();
    let _ = node.client.get_job(1 << 40).await;
    let admin = node.node().admin_addr.to_string();
    eventually(Duration::from_secs(10), "every used metric on /metrics", || {
        let (admin, used) = (admin.clone(), used.clone());
        async move {
            let (_, body) = http_get(&admin, "/metrics").await.unwrap();
            let exported = metric_names(&body);
            let missing: Vec<&String> = used.iter().filter(|m| !exported.contains(*m)).collect();
            if !missing.is_empty() {
                eprintln!("not (yet) exported: {missing:?}");
            }
            missing.is_empty()
        }
    })
    .await;

    let mut check_rules = Command::new(tool("promtool"));
    check_rules.arg("check").arg("rules").arg(repo("deploy/prometheus-rules.yml"));
    run(check_rules);
    let mut check_config = Command::new(tool("promtool"));
    check_config.arg("check").arg("config").arg(repo("deploy/prometheus.yml"));
    run(check_config);
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Prometheus on a free loopback port with this configuration and
/// storage directory; returns it (killed when dropped) and its address.
fn start_prometheus(config_path: &Path, data: &Path) -> (Killed, String) {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let prometheus = Killed(
        Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus runs (scripts/setup.sh installs it)"),
    );
    (prometheus, addr)
}

async fn prometheus_query(addr: &str, query: &str) -> serde_json::Value {
    let encoded: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let (_, body) = http_get(addr, &format!("/api/v1/query?query={encoded}")).await.unwrap_or_default();
    serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_a_three_node_cluster() {
    let cluster = ProcessCluster::start(3, 3, 3, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    // deploy/prometheus.yml with the targets pointed at this cluster and a
    // one-second interval; everything else as shipped.
    let dir = tempfile::tempdir().unwrap();
    let mut config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo("deploy/prometheus.yml")).unwrap()).unwrap();
    let job = &mut config["scrape_configs"][0];
    assert_eq!(job["metrics_path"].as_str(), Some("/metrics"));
    job["scrape_interval"] = Value::from("1s");
    let targets: Vec<Value> = (0..3).map(|i| Value::from(cluster.node(i).admin.clone())).collect();
    job["static_configs"][0]["targets"] = Value::Sequence(targets);
    config["global"]["scrape_interval"] = Value::from("1s");
    std::fs::copy(repo("deploy/prometheus-rules.yml"), dir.path().join("prometheus-rules.yml")).unwrap();
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let (_prometheus, addr) = start_prometheus(&config_path, &dir.path().join("data"));

    eventually(Duration::from_secs(60), "Prometheus to see all three targets up", || {
        let addr = addr.clone();
        async move {
            let reply = prometheus_query(&addr, r#"sum(up{job="drover"})"#).await;
            reply["data"]["result"][0]["value"][1].as_str() == Some("3")
        }
    })
    .await;
    let completed = r#"sum(drover_jobs_total{outcome="completed",type="prom"}) or vector(0)"#;
    let before: f64 =
        prometheus_query(&addr, completed).await["data"]["result"][0]["value"][1].as_str().unwrap().parse().unwrap();
    let client = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let mut done = 0;
    for _ in 0..12 {
        client.create_job("prom", "{}").await.unwrap();
    }
    while done < 12 {
        for job in client.activate("prom", "w", 12, 60_000, 5_000).await.unwrap() {
            client.complete(job.key, job.attempt, "{}").await.unwrap();
            done += 1;
        }
    }
    eventually(Duration::from_secs(30), "the completed counter in Prometheus to grow by 12", || {
        let addr = addr.clone();
        async move {
            let reply = prometheus_query(&addr, completed).await;
            let now: f64 = reply["data"]["result"][0]["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(-1.0);
            now - before == 12.0
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_file_starts_a_cluster_that_serves_jobs() {
    let mut compose: Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo("deploy/compose.yaml")).unwrap()).unwrap();
    compose.apply_merge().unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let names: Vec<String> =
        services.keys().filter_map(|k| k.as_str()).filter(|k| k.starts_with("drover-")).map(String::from).collect();
    assert_eq!(names.len(), 3, "three Drover services");
    // Each compose host gets its own loopback address; ports stay as written.
    let host_ip = |host: &str| -> String {
        match host {
            "drover-0" => "127.0.0.11".into(),
            "drover-1" => "127.0.0.12".into(),
            "drover-2" => "127.0.0.13".into(),
            _ => "127.0.0.19".into(), // the collector: nothing listens there
        }
    };
    let map_hosts = |value: &str, own: &str| -> String {
        let mut v = value.replace("0.0.0.0", &host_ip(own));
        for host in ["drover-0", "drover-1", "drover-2", "otel-collector"] {
            v = v.replace(&format!("{host}:"), &format!("{}:", host_ip(host)));
        }
        v
    };
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for name in &names {
        let service = &services[name.as_str()];
        let command: Vec<String> =
            service["command"].as_sequence().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
        let mut process = Command::new(common::drover_bin());
        process.args(&command).env_clear().env("RUST_LOG", "warn");
        for (key, value) in service["environment"].as_mapping().unwrap() {
            let (key, value) = (key.as_str().unwrap(), value.as_str().unwrap());
            let value = if key == "DROVER_DATA_DIR" {
                dir.path().join(name).display().to_string()
            } else {
                map_hosts(value, name)
            };
            process.env(key, value);
        }
        process.stdout(Stdio::null()).stderr(Stdio::inherit());
        nodes.push(Killed(process.spawn().unwrap()));
    }
    let gateway = format!("{}:26500", host_ip("drover-1"));
    eventually(Duration::from_secs(60), "the compose cluster to elect leaders", || {
        let gateway = gateway.clone();
        async move {
            let Ok(client) = Client::connect(&gateway).await else { return false };
            let Ok(topology) = client.topology().await else { return false };
            topology.brokers.len() == 3
                && (0..topology.partitions_count).all(|p| {
                    topology
                        .brokers
                        .iter()
                        .any(|b| b.partitions.iter().any(|i| i.partition_id == p && i.role == "leader"))
                })
        }
    })
    .await;
    let client = Client::connect(&format!("{}:26500", host_ip("drover-2"))).await.unwrap();
    let key = client.create_job("compose", r#"{"ok":true}"#).await.unwrap();
    let job = client.activate("compose", "w", 1, 60_000, 10_000).await.unwrap().remove(0);
    assert_eq!(job.key, key);
    client.complete(job.key, job.attempt, "{}").await.unwrap();
    drop(nodes);
}

/// The chart with TLS on (its default) and a tokens Secret, started as
/// processes with exactly the command, arguments and environment it renders
/// and the Secrets' files where it mounts them: only host names and paths are
/// mapped to this machine (each pod gets its own loopback address, the mount
/// and data directories a temporary one). The certificate names the pods as
/// cert-manager's would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helm_chart_with_tls_and_tokens_renders_nodes_that_serve_jobs_over_tls() {
    let mut template = Command::new(tool("helm"));
    template.args(["template", "drover", "--namespace", "jobs"]).arg(repo("helm/drover"));
    template.args(["--set", "clusterSize=3,replicationFactor=3,partitionCount=2,auth.tokensSecret=drover-tokens"]);
    let docs = documents(&run(template));
    let set = kind(&docs, "StatefulSet")[0];
    let set_name = set["metadata"]["name"].as_str().unwrap().to_string();
    let headless = set["spec"]["serviceName"].as_str().unwrap().to_string();
    let pod = &set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["scheme"].as_str(), Some("HTTPS"), "TLS is on by default");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("tls"))
        .expect("the TLS Secret is mounted");
    let mount_path = mount["mountPath"].as_str().unwrap().to_string();
    let secret = pod["volumes"].as_sequence().unwrap().iter().find(|v| v["name"].as_str() == Some("tls")).unwrap();
    assert_eq!(secret["secret"]["secretName"].as_str(), Some(format!("{set_name}-tls").as_str()));
    assert!(mount["subPath"].is_null(), "a subPath mount would never see a renewed Secret");
    let tokens_mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("tokens"))
        .expect("the tokens Secret is mounted");
    let tokens_path = tokens_mount["mountPath"].as_str().unwrap().to_string();
    let tokens_volume = pod["volumes"].as_sequence().unwrap().iter().find(|v| v["name"].as_str() == Some("tokens"));
    assert_eq!(tokens_volume.unwrap()["secret"]["secretName"].as_str(), Some("drover-tokens"));

    // The Secret's files, as cert-manager would write them for this release.
    let dir = tempfile::tempdir().unwrap();
    let secret_dir = dir.path().join("tls");
    std::fs::create_dir_all(&secret_dir).unwrap();
    let pod_ip = |i: usize| format!("127.0.0.{}", 31 + i);
    let authority = drover::tls::DevCa::new("cluster CA").unwrap();
    let mut names: Vec<String> = (0..3).map(|i| format!("{set_name}-{i}.{headless}.jobs.svc")).collect();
    names.extend((0..3).map(pod_ip));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (cert, key) = authority.issue(&names).unwrap();
    std::fs::write(secret_dir.join("tls.crt"), cert).unwrap();
    drover::tls::write_private(&secret_dir.join("tls.key"), &key).unwrap();
    std::fs::write(secret_dir.join("ca.crt"), authority.pem()).unwrap();
    // The tokens Secret: one producer-and-worker token for this test's type.
    let tokens_dir = dir.path().join("tokens");
    std::fs::create_dir_all(&tokens_dir).unwrap();
    let secret = drover::auth::keys::generate_secret();
    let scopes = ["jobs:create:helm-tls".to_string(), "jobs:work:helm-tls".to_string()];
    let entry = drover::auth::keys::token_entry("helm-test", &secret, &scopes, &["<default>".to_string()]);
    std::fs::write(tokens_dir.join("tokens.toml"), entry).unwrap();

    let args: Vec<String> =
        container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut process = Command::new(common::drover_bin());
        process.args(&args).env_clear().env("RUST_LOG", "warn").env("HOSTNAME", format!("{set_name}-{i}"));
        for entry in container["env"].as_sequence().unwrap() {
            let (name, value) = (entry["name"].as_str().unwrap(), entry["value"].as_str().unwrap());
            let mut value = value
                .replace("0.0.0.0", &pod_ip(i))
                .replace(&mount_path, secret_dir.to_str().unwrap())
                .replace(&tokens_path, tokens_dir.to_str().unwrap());
            for j in 0..3 {
                value = value.replace(&format!("{set_name}-{j}.{headless}.jobs.svc"), &pod_ip(j));
            }
            if name == "DROVER_DATA_DIR" {
                value = dir.path().join(format!("node-{i}")).display().to_string();
            }
            process.env(name, value);
        }
        process.stdout(Stdio::null()).stderr(Stdio::inherit());
        nodes.push(Killed(process.spawn().unwrap()));
    }

    let ca = authority.pem().into_bytes();
    // Node 0 ready, as the probe asks, and node 1, whose gateway the client dials.
    for i in 0..2 {
        let admin = format!("{}:9600", pod_ip(i));
        eventually(Duration::from_secs(60), &format!("node {i} to be ready over HTTPS, as the probe asks"), || {
            let (admin, ca) = (admin.clone(), ca.clone());
            async move { drover::tls::https_get(&admin, "/ready", &ca).await.is_ok_and(|(code, _)| code == 200) }
        })
        .await;
    }
    let anonymous = Client::connect_with_ca(&format!("https://{}:26500", pod_ip(1)), Some(&ca)).await.unwrap();
    let client = anonymous.with_token(&secret).unwrap();
    let started = std::time::Instant::now();
    let key = loop {
        match client.create_job("helm-tls", r#"{"ok":true}"#).await {
            Ok(key) => break key,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(60), "no create over TLS within 60 s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let job = client.activate("helm-tls", "w", 1, 60_000, 10_000).await.unwrap().remove(0);
    assert_eq!(job.key, key);
    client.complete(job.key, job.attempt, "{}").await.unwrap();
    let refused = anonymous.create_job("helm-tls", "{}").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "a node rendered with a tokens Secret took no token");
    let plain = Client::connect(&format!("{}:26500", pod_ip(2))).await;
    assert!(
        match plain {
            Err(_) => true,
            Ok(plain) => plain.create_job("plain", "{}").await.is_err(),
        },
        "a node rendered with TLS served a plaintext client"
    );
    drop(nodes);
}

/// The chart's ServiceMonitor, turned into the scrape Prometheus runs: over
/// TLS against the release's CA, with the read-only metrics token. A real
/// Prometheus scrapes a node with TLS and tokens on that way, and is refused
/// without the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_over_tls_with_the_read_only_token_the_service_monitor_names() {
    let mut template = Command::new(tool("helm"));
    template.args(["template", "drover", "--namespace", "jobs"]).arg(repo("helm/drover"));
    template.args([
        "--set",
        "serviceMonitor.enabled=true,auth.tokensSecret=drover-tokens,auth.metricsToken.secretName=drover-metrics",
    ]);
    let docs = documents(&run(template));
    let monitor = kind(&docs, "ServiceMonitor");
    assert_eq!(monitor.len(), 1, "serviceMonitor.enabled renders one ServiceMonitor");
    let endpoint = &monitor[0]["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"), "TLS is on by default, so the scrape is too");
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["key"].as_str(), Some("ca.crt"));
    let server_name = endpoint["tlsConfig"]["serverName"].as_str().expect("a server name to verify").to_string();
    assert_eq!(endpoint["authorization"]["type"].as_str(), Some("Bearer"));
    assert_eq!(endpoint["authorization"]["credentials"]["name"].as_str(), Some("drover-metrics"));

    // A node with TLS on its ports and a tokens file holding the metrics
    // token: cluster:read and nothing else.
    let dir = tempfile::tempdir().unwrap();
    let authority = drover::tls::DevCa::new("release CA").unwrap();
    let (cert, key) = authority.issue(&["127.0.0.1", &server_name]).unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("ca.crt"), authority.pem()).unwrap();
    std::fs::write(path("tls.crt"), cert).unwrap();
    drover::tls::write_private(&path("tls.key"), &key).unwrap();
    let secret = drover::auth::keys::generate_secret();
    let entry = drover::auth::keys::token_entry("metrics", &secret, &["cluster:read".into()], &[]);
    std::fs::write(path("tokens.toml"), entry).unwrap();
    std::fs::write(path("token"), &secret).unwrap();
    let show = |p: PathBuf| p.display().to_string();
    let (cert_arg, key_arg, tokens_arg) = (show(path("tls.crt")), show(path("tls.key")), show(path("tokens.toml")));
    let data = path("data");
    let node = common::NodeProcess::start(
        &data,
        &["--tls-cert", &cert_arg, "--tls-key", &key_arg, "--tokens-file", &tokens_arg],
    );

    // Two jobs from the endpoint as written, one without the token.
    let scrape = |job: &str, with_token: bool| {
        let mut config = serde_json::json!({
            "job_name": job,
            "scrape_interval": "1s",
            "metrics_path": endpoint["path"].as_str().unwrap(),
            "scheme": endpoint["scheme"].as_str().unwrap(),
            "tls_config": {"ca_file": show(path("ca.crt")), "server_name": server_name},
            "static_configs": [{"targets": [node.admin.clone()]}],
        });
        if with_token {
            config["authorization"] = serde_json::json!({"type": "Bearer", "credentials_file": show(path("token"))});
        }
        config
    };
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [scrape("with-token", true), scrape("without-token", false)],
    });
    let config_path = path("prometheus.yml");
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let (_prometheus, addr) = start_prometheus(&config_path, &path("prometheus"));
    let value = |reply: serde_json::Value| reply["data"]["result"][0]["value"][1].as_str().map(String::from);
    eventually(Duration::from_secs(60), "Prometheus to scrape the node over TLS with the token", || {
        let addr = addr.clone();
        async move { value(prometheus_query(&addr, r#"up{job="with-token"}"#).await).as_deref() == Some("1") }
    })
    .await;
    let raft = value(prometheus_query(&addr, r#"count(drover_partition_has_leader{job="with-token"})"#).await);
    assert!(raft.is_some(), "the scraped series include Drover's own");
    eventually(Duration::from_secs(30), "the scrape without the token to be refused", || {
        let addr = addr.clone();
        async move { value(prometheus_query(&addr, r#"up{job="without-token"}"#).await).as_deref() == Some("0") }
    })
    .await;
    drop(node);
}

/// With locations, the chart names each node's REGION/ZONE in the member
/// list (which a node accepts), spreads pods over zones, and passes the
/// leader regions and network profile; a location list of the wrong length
/// is refused at render time.
#[test]
fn the_helm_chart_names_node_locations_and_spreads_pods_over_zones() {
    let chart = repo("helm/drover");
    let mut template = Command::new(tool("helm"));
    template
        .args(["template", "drover", "--namespace", "jobs"])
        .arg(&chart)
        .args(["--set", "tls.enabled=false"])
        .args(["--set", "locality.locations={eu/eu-a,eu/eu-b,us/us-a}"])
        .args(["--set", "locality.leaderRegions={eu}", "--set", "locality.networkProfile=wan"]);
    let docs = documents(&run(template));
    let set = kind(&docs, "StatefulSet")[0];
    let pod = &set["spec"]["template"]["spec"];
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"].as_str(), Some("topology.kubernetes.io/zone"));
    assert_eq!(spread["whenUnsatisfiable"].as_str(), Some("DoNotSchedule"));
    let container = &pod["containers"][0];
    let members: Vec<String> = env_of(container, "DROVER_MEMBERS").unwrap().split(',').map(String::from).collect();
    assert!(members[2].ends_with("@us/us-a"), "{members:?}");
    assert_eq!(env_of(container, "DROVER_LEADER_REGIONS"), Some("eu"));
    assert_eq!(env_of(container, "DROVER_NETWORK_PROFILE"), Some("wan"));
    let config = drover::config::ServeArgs {
        node_id: Some(2),
        members: Some(members),
        leader_regions: Some(vec!["eu".into()]),
        network_profile: Some("wan".into()),
        ..Default::default()
    }
    .resolve()
    .expect("a node takes the rendered settings");
    assert_eq!((config.location.region.as_str(), config.location.zone.as_str()), ("us", "us-a"));

    let mut wrong = Command::new(tool("helm"));
    wrong.args(["template", "drover"]).arg(&chart).args(["--set", "locality.locations={eu/eu-a}"]);
    let output = wrong.output().expect("helm runs");
    assert!(!output.status.success(), "one location for three nodes renders");
    assert!(String::from_utf8_lossy(&output.stderr).contains("give one per node"));
}

/// The storage gauges cover every column family: RocksDB answers sizes per
/// column family, and the default one holds no data. A few hundred jobs are
/// never flushed, so the memtables hold at least every byte put since start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_gauges_count_every_column_family() {
    let node = LocalNode::start().await;
    let pad = "x".repeat(512);
    for n in 0..300 {
        node.client.create_job("gauges", &format!(r#"{{"n":{n},"pad":"{pad}"}}"#)).await.unwrap();
    }
    let (_, body) = http_get(&node.node().admin_addr.to_string(), "/metrics").await.unwrap();
    let put = common::metric_sum(&body, "drover_storage_put_bytes_total");
    let memtables = common::metric_sum(&body, "drover_rocksdb_memtable_bytes");
    assert!(put > 150_000.0, "300 jobs of 512-byte variables put {put} bytes");
    assert!(memtables >= put, "the memtables ({memtables} bytes) hold what was put ({put} bytes)");
    for block in ["filter", "index", "data"] {
        let loaded = format!("drover_rocksdb_block_cache_loaded_bytes_total{{block=\"{block}\"}}");
        assert!(body.contains(&loaded), "no {loaded} in the metrics");
    }

    // The allocator's totals (this test binary links the node's jemalloc):
    // what is allocated includes the memtables' arenas, and fits in what is
    // resident.
    let allocated = common::metric_sum(&body, "drover_allocator_allocated_bytes");
    let resident = common::metric_sum(&body, "drover_allocator_resident_bytes");
    assert!(allocated >= memtables, "allocated {allocated} bytes, under the memtables' {memtables}");
    assert!(resident >= allocated, "resident {resident} bytes, under the {allocated} allocated");
}
