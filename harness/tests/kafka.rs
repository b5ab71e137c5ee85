//! The Kafka fixture itself: a node starts, restarts on its ports with
//! its data, and a three-node cluster survives one node's kill -9.

use std::net::TcpStream;

use sluice_harness::kafka::KafkaServer;

fn reachable(addr: &str) -> bool {
    TcpStream::connect(addr).is_ok()
}

#[test]
fn one_node_starts_stops_and_restarts_on_its_port() {
    let mut kafka = KafkaServer::start().expect("Kafka starts");
    let brokers = kafka.brokers();
    assert!(reachable(&brokers), "{brokers}");
    kafka.stop();
    assert!(!reachable(&brokers), "stopped, yet {brokers} answers");
    kafka.start_again().expect("Kafka starts again");
    assert_eq!(kafka.brokers(), brokers);
    assert!(reachable(&brokers));
}

#[test]
fn a_cluster_of_three_takes_a_node_killed_and_started_again() {
    let mut cluster = KafkaServer::start_cluster().expect("three nodes start");
    let brokers = cluster.brokers();
    let addrs: Vec<&str> = brokers.split(',').collect();
    assert_eq!(addrs.len(), 3);
    cluster.kill_node(1);
    assert!(!reachable(addrs[1]));
    assert!(reachable(addrs[0]) && reachable(addrs[2]));
    cluster.start_node(1).expect("node 2 starts again");
    assert!(reachable(addrs[1]));
}
