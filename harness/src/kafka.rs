//! Apache Kafka for end-to-end tests: [`KafkaServer`] runs Kafka's own
//! broker (KRaft, each node a combined broker and controller) from its
//! Maven Central jars with the machine's Java, on free loopback ports,
//! with its data in a temporary directory of its own.
//!
//! - [`KafkaServer::start`]: one node, one plaintext listener.
//! - [`KafkaServer::start_secure`]: one node that also serves TLS (client
//!   certificates required), SASL_SSL with SCRAM-SHA-512 and
//!   SASL_PLAINTEXT with PLAIN, for the given users, with KRaft's
//!   `StandardAuthorizer` on: a SASL user may do only what an ACL grants
//!   (the plaintext listener's anonymous user and the TLS client are
//!   super users, so tests can set things up through them).
//! - [`KafkaServer::start_cluster`]: three nodes (three controllers and
//!   brokers), replication factor 3 and `min.insync.replicas` 2; any one
//!   node can be stopped, killed and started again.
//!
//! Each node waits until it says it started and takes connections before
//! it is handed out; [`restart`](KafkaServer::restart) stops and starts it
//! on the same ports with the same data; every node is killed on drop,
//! even when the test panicked. Segments and retention are small, so a
//! test run cannot fill the disk.
//!
//! The jars are `$SLUICE_KAFKA_LIBS`, else the ones [`install`] put in
//! `$HOME/.cache/sluice/kafka/<KAFKA_VERSION>/libs` (`cargo xtask setup`
//! runs it). Java is `$JAVA_HOME/bin/java`, else `java` on `$PATH`. A
//! missing broker or Java is an error that says how to install it, never
//! a skipped test.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::kafka::KafkaServer;
//!
//! let mut kafka = KafkaServer::start()?;
//! let brokers = kafka.brokers(); // 127.0.0.1:<free port>
//! kafka.restart()?; // same ports, same data
//! let mut cluster = KafkaServer::start_cluster()?;
//! cluster.kill_node(1); // kill -9 of one of three
//! cluster.start_node(1)?;
//! # Ok(()) }
//! ```

use std::fmt::Write as _;
use std::io::{Read as _, Seek as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::free_port;

/// The Apache Kafka release the tests run, from Maven Central
/// (`org.apache.kafka:kafka_2.13`).
pub const KAFKA_VERSION: &str = "4.1.1";
/// The Log4j 2 binding for the SLF4J 1.7 API Kafka's classes log
/// through (Kafka's own distribution ships it; the POM does not bring
/// it), at the version of the `log4j-core` Kafka's POM brings.
const LOG4J_SLF4J_VERSION: &str = "2.24.3";

/// How long a node may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stop may take before the node is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// What a node prints once it serves.
const STARTED: &str = "Kafka Server started";

/// The SCRAM mechanism of the SASL_SSL listener.
pub const SCRAM_MECHANISM: &str = "SCRAM-SHA-512";

/// Where [`install`] puts the jars: `$HOME/.cache/sluice/kafka/<version>`.
///
/// # Errors
///
/// When `$HOME` is not set.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("$HOME is not set")?;
    Ok(PathBuf::from(home)
        .join(".cache/sluice/kafka")
        .join(KAFKA_VERSION))
}

/// The directory of the broker's jars: `$SLUICE_KAFKA_LIBS`, else the
/// cache [`install`] fills.
///
/// # Errors
///
/// When neither holds Kafka's jar (the message says how to install it).
pub fn libs_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("SLUICE_KAFKA_LIBS").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir()?.join("libs"),
    };
    let jar = dir.join(format!("kafka_2.13-{KAFKA_VERSION}.jar"));
    if !jar.is_file() {
        bail!(
            "Apache Kafka {KAFKA_VERSION} is not installed: {} is missing. Run `cargo xtask setup` \
             (it fetches the broker's jars from Maven Central with `mvn`), or set \
             $SLUICE_KAFKA_LIBS to a directory holding Kafka {KAFKA_VERSION}'s jars (a Kafka \
             distribution's `libs/`)",
            jar.display()
        );
    }
    Ok(dir)
}

/// Fetches the broker's jars (`kafka_2.13` and what it depends on at run
/// time, plus the Log4j binding of its log) from Maven Central with `mvn`
/// into [`cache_dir`]`/libs`. A quick no-op once done.
///
/// # Errors
///
/// When `mvn` is missing or fails.
pub fn install() -> anyhow::Result<()> {
    let root = cache_dir()?;
    let libs = root.join("libs");
    let stamp = root.join("complete");
    if stamp.is_file()
        && libs
            .join(format!("kafka_2.13-{KAFKA_VERSION}.jar"))
            .is_file()
    {
        return Ok(());
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let pom = format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.sluice</groupId>
  <artifactId>kafka-test-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"#
    );
    std::fs::write(root.join("pom.xml"), pom).context("writing the broker's POM")?;
    let _ = std::fs::remove_dir_all(&libs);
    let status = Command::new("mvn")
        .args([
            "-q",
            "-B",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
        ])
        .arg(format!("-DoutputDirectory={}", libs.display()))
        .current_dir(&root)
        .stdin(Stdio::null())
        .status()
        .context(
            "could not run `mvn`: install Maven (Debian: `apt-get install maven`) to fetch Apache \
             Kafka's jars",
        )?;
    if !status.success() {
        bail!(
            "`mvn dependency:copy-dependencies` of Apache Kafka {KAFKA_VERSION} failed ({status})"
        );
    }
    std::fs::write(&stamp, KAFKA_VERSION).context("writing the install stamp")?;
    Ok(())
}

/// `$JAVA_HOME/bin/java`, else `java`.
fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join("bin/java"))
        .filter(|j| j.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

/// Runs a Kafka class to completion (the storage tool).
fn run_java(libs: &Path, args: &[&str], log4j: &Path) -> anyhow::Result<String> {
    let out = Command::new(java())
        .arg("-Xmx256m")
        .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
        .arg("-cp")
        .arg(libs.join("*"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("could not run `java`: install a JDK 17 or later (Debian: `apt-get install openjdk-17-jre-headless`) or set $JAVA_HOME")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("java {args:?} failed ({}):\n{text}", out.status);
    }
    Ok(text)
}

/// The TLS material and users of a secure broker.
pub struct Secure {
    /// The broker's certificate (PEM, with `127.0.0.1` among its names).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8).
    pub key_pem: String,
    /// The CA the TLS listener checks client certificates against (PEM).
    pub client_ca_pem: String,
    /// The SASL users: each is a SCRAM-SHA-512 user and a PLAIN user.
    pub users: Vec<(String, String)>,
}

/// One of a secure broker's listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Plain TCP; its clients are the super user `ANONYMOUS`.
    Plaintext,
    /// TLS with client certificates required (a super user).
    Ssl,
    /// SASL over TLS, SCRAM-SHA-512.
    SaslSsl,
    /// SASL over plain TCP, PLAIN.
    SaslPlaintext,
}

/// One node's ports.
#[derive(Clone, Copy)]
struct Ports {
    plaintext: u16,
    controller: u16,
    ssl: Option<u16>,
    sasl_ssl: Option<u16>,
    sasl_plaintext: Option<u16>,
}

struct Node {
    id: u32,
    ports: Ports,
    child: Option<Child>,
    props: PathBuf,
    log: PathBuf,
    /// Where this run's part of the log starts.
    log_from: u64,
}

/// A running Apache Kafka of this test's own: one node or a cluster.
pub struct KafkaServer {
    nodes: Vec<Node>,
    libs: PathBuf,
    log4j: PathBuf,
    dir: tempfile::TempDir,
}

impl KafkaServer {
    /// One node (broker and controller), one plaintext listener.
    ///
    /// # Errors
    ///
    /// When Kafka or Java is missing, or the node does not start in time
    /// (the error quotes its log).
    pub fn start() -> anyhow::Result<KafkaServer> {
        KafkaServer::launch(1, None)
    }

    /// One node with the plaintext listener and the secure ones (see
    /// [`Listener`]), users and ACLs enforced.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_secure(secure: &Secure) -> anyhow::Result<KafkaServer> {
        KafkaServer::launch(1, Some(secure))
    }

    /// Three nodes, each a broker and a controller: topics are created
    /// with three replicas and take writes with two in sync.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_cluster() -> anyhow::Result<KafkaServer> {
        KafkaServer::launch(3, None)
    }

    fn launch(count: u32, secure: Option<&Secure>) -> anyhow::Result<KafkaServer> {
        let libs = libs_dir()?;
        let dir = tempfile::tempdir().context("a temporary directory for Kafka")?;
        let log4j = dir.path().join("log4j2.properties");
        std::fs::write(&log4j, LOG4J).context("writing log4j2.properties")?;
        let mut ports = Vec::new();
        for _ in 0..count {
            let secure_port = || secure.map(|_| free_port()).transpose();
            ports.push(Ports {
                plaintext: free_port()?,
                controller: free_port()?,
                ssl: secure_port()?,
                sasl_ssl: secure_port()?,
                sasl_plaintext: secure_port()?,
            });
        }
        let voters = ports
            .iter()
            .zip(1..)
            .map(|(p, id)| format!("{id}@127.0.0.1:{}", p.controller))
            .collect::<Vec<_>>()
            .join(",");
        if let Some(secure) = secure {
            std::fs::write(dir.path().join("server.pem"), server_keystore(secure))?;
            std::fs::write(dir.path().join("client-ca.pem"), &secure.client_ca_pem)?;
        }
        let cluster_id = run_java(&libs, &["kafka.tools.StorageTool", "random-uuid"], &log4j)?
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(str::to_owned)
            .context("the storage tool printed no cluster id")?;
        let mut nodes = Vec::new();
        for (id, p) in (1..).zip(&ports) {
            let node_dir = dir.path().join(format!("node-{id}"));
            std::fs::create_dir_all(&node_dir)?;
            let props = node_dir.join("server.properties");
            std::fs::write(
                &props,
                properties(id, *p, &voters, count, &node_dir, dir.path(), secure),
            )?;
            let mut format = vec![
                "kafka.tools.StorageTool".to_owned(),
                "format".into(),
                "-t".into(),
                cluster_id.clone(),
                "-c".into(),
                props.display().to_string(),
            ];
            for (user, password) in secure.iter().flat_map(|s| &s.users) {
                format.push("--add-scram".into());
                format.push(format!(
                    "{SCRAM_MECHANISM}=[name={user},password={password}]"
                ));
            }
            let format: Vec<&str> = format.iter().map(String::as_str).collect();
            run_java(&libs, &format, &log4j)
                .with_context(|| format!("formatting node {id}'s storage"))?;
            nodes.push(Node {
                id,
                ports: *p,
                child: None,
                props,
                log: node_dir.join("kafka.log"),
                log_from: 0,
            });
        }
        let mut server = KafkaServer {
            nodes,
            libs,
            log4j,
            dir,
        };
        // All at once: a controller quorum of three elects a leader only
        // once two are up.
        for i in 0..server.nodes.len() {
            server.spawn(i)?;
        }
        for i in 0..server.nodes.len() {
            server.wait_started(i)?;
        }
        Ok(server)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .context("Kafka's log file")?;
        node.log_from = log.metadata().map(|m| m.len()).unwrap_or(0);
        let child = Command::new(java())
            .args(JVM_OPTIONS)
            .arg(format!("-Dlog4j2.configurationFile={}", self.log4j.display()))
            .arg("-cp")
            .arg(self.libs.join("*"))
            .arg("kafka.Kafka")
            .arg(&node.props)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("could not run `java`: install a JDK 17 or later (Debian: `apt-get install openjdk-17-jre-headless`) or set $JAVA_HOME")?;
        node.child = Some(child);
        Ok(())
    }

    fn wait_started(&mut self, i: usize) -> anyhow::Result<()> {
        let started = Instant::now();
        let port = self.nodes[i].ports.plaintext;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        loop {
            if self.node_log(i).contains(STARTED)
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            let id = self.nodes[i].id;
            if let Some(child) = self.nodes[i].child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.nodes[i].child = None;
                bail!(
                    "Kafka node {id} exited ({status}) on port {port}; log:\n{}",
                    self.node_log(i)
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "Kafka node {id} did not start on port {port} within {START_TIMEOUT:?}; log:\n{}",
                    self.node_log(i)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Node `i`'s log since it was last started.
    fn node_log(&self, i: usize) -> String {
        let node = &self.nodes[i];
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&node.log) {
            let _ = file.seek(std::io::SeekFrom::Start(node.log_from));
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Every node's plaintext `127.0.0.1:PORT`, comma-separated, for
    /// `bootstrap.servers`.
    pub fn brokers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.ports.plaintext))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The first node's address on `listener` (`None` on a server that
    /// does not serve it).
    pub fn listener(&self, listener: Listener) -> Option<String> {
        let ports = self.nodes[0].ports;
        let port = match listener {
            Listener::Plaintext => Some(ports.plaintext),
            Listener::Ssl => ports.ssl,
            Listener::SaslSsl => ports.sasl_ssl,
            Listener::SaslPlaintext => ports.sasl_plaintext,
        }?;
        Some(format!("127.0.0.1:{port}"))
    }

    /// How many nodes there are.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Stops every node (SIGTERM, then SIGKILL past a deadline) and starts
    /// them again on the same ports with the same data. Clients see
    /// dropped connections and refused connects meanwhile.
    ///
    /// # Errors
    ///
    /// When a node does not start again in time.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.start_again()
    }

    /// Stops every node; their data stays for
    /// [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop_node(i);
        }
    }

    /// Starts the stopped nodes again on the same ports and data.
    ///
    /// # Errors
    ///
    /// When one does not start in time.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        let stopped: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].child.is_none())
            .collect();
        for i in &stopped {
            self.spawn(*i)?;
        }
        for i in stopped {
            self.wait_started(i)?;
        }
        Ok(())
    }

    /// Stops node `i` (0-based) gracefully.
    pub fn stop_node(&mut self, i: usize) {
        if let Some(child) = self.nodes[i].child.take() {
            crate::process::terminate(child, STOP_TIMEOUT);
        }
    }

    /// Kills node `i` (0-based) with SIGKILL, as a crash would.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(child) = self.nodes[i].child.take() {
            crate::process::kill(child);
        }
    }

    /// Starts node `i` (0-based) again, stopped or killed, on its ports
    /// and data, and waits until it serves.
    ///
    /// # Errors
    ///
    /// When it is running, or does not start in time.
    pub fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].child.is_some() {
            bail!("Kafka node {} is running", self.nodes[i].id);
        }
        self.spawn(i)?;
        self.wait_started(i)
    }

    /// Every node's log so far (the last 200 lines of each).
    pub fn log(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = std::fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let _ = writeln!(out, "--- Kafka node {} ---", node.id);
            for line in &lines[lines.len().saturating_sub(200)..] {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }
}

impl Drop for KafkaServer {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.take() {
                crate::process::kill(child);
            }
        }
    }
}

/// Small for two cores: a small heap, the serial collector, few JIT
/// threads.
const JVM_OPTIONS: &[&str] = &[
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:CICompilerCount=2",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
];

/// Warnings and up, plus the line that says a node started, to stdout
/// (the node's log file).
const LOG4J: &str = "\
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
logger.group.name = org.apache.kafka.coordinator.group
logger.group.level = INFO
";

/// The broker's key and certificate in one PEM file (Kafka's `PEM`
/// keystore type).
fn server_keystore(secure: &Secure) -> String {
    format!("{}\n{}\n", secure.key_pem.trim(), secure.cert_pem.trim())
}

/// Node `id`'s `server.properties`.
fn properties(
    id: u32,
    ports: Ports,
    voters: &str,
    count: u32,
    node_dir: &Path,
    dir: &Path,
    secure: Option<&Secure>,
) -> String {
    let replicas = count.min(3);
    let min_isr = if count >= 3 { 2 } else { 1 };
    let mut listeners = vec![
        format!("PLAINTEXT://127.0.0.1:{}", ports.plaintext),
        format!("CONTROLLER://127.0.0.1:{}", ports.controller),
    ];
    let mut advertised = vec![format!("PLAINTEXT://127.0.0.1:{}", ports.plaintext)];
    let mut map = vec!["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"];
    let mut extra = String::new();
    if let Some(secure) = secure {
        for (name, port, protocol) in [
            ("SSL", ports.ssl, "SSL:SSL"),
            ("SASL_SSL", ports.sasl_ssl, "SASL_SSL:SASL_SSL"),
            (
                "SASL_PLAINTEXT",
                ports.sasl_plaintext,
                "SASL_PLAINTEXT:SASL_PLAINTEXT",
            ),
        ] {
            if let Some(port) = port {
                listeners.push(format!("{name}://127.0.0.1:{port}"));
                advertised.push(format!("{name}://127.0.0.1:{port}"));
                map.push(protocol);
            }
        }
        let plain_users: String = secure
            .users
            .iter()
            .map(|(u, p)| format!(" user_{u}=\"{p}\""))
            .collect();
        let keystore = dir.join("server.pem");
        let client_ca = dir.join("client-ca.pem");
        let _ = write!(
            extra,
            "\
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
ssl.truststore.type=PEM
ssl.truststore.location={client_ca}
listener.name.ssl.ssl.client.auth=required
ssl.endpoint.identification.algorithm=
sasl.enabled.mechanisms={SCRAM_MECHANISM},PLAIN
listener.name.sasl_ssl.sasl.enabled.mechanisms={SCRAM_MECHANISM}
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required{plain_users};
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:CN=sluice-client
",
            keystore = keystore.display(),
            client_ca = client_ca.display(),
        );
    }
    format!(
        "\
process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
listeners={listeners}
advertised.listeners={advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map={map}
log.dirs={data}
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=10000
group.consumer.min.heartbeat.interval.ms=1000
group.consumer.heartbeat.interval.ms=1000
auto.create.topics.enable=false
num.network.threads=2
num.io.threads=2
background.threads=2
num.replica.fetchers=1
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
group.coordinator.threads=1
share.coordinator.threads=1
log.segment.bytes=16777216
log.retention.bytes=268435456
log.retention.check.interval.ms=30000
metadata.log.segment.bytes=8388608
metadata.max.retention.bytes=33554432
{extra}",
        listeners = listeners.join(","),
        advertised = advertised.join(","),
        map = map.join(","),
        data = node_dir.join("data").display(),
    )
}
