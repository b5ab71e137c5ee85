//! The Kafka fixture itself: a node starts, stops and starts again on its
//! port. (Its data surviving the restart, and the three-node cluster
//! with a node killed, are shown by the Kafka connector's tests.)

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
