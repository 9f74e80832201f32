//! The cluster plan in partition 0's state machine: snapshotted at data
//! version 15 whatever the cluster version, installed with the rest, stored
//! as one record and found again on reopening; a report of a partition's
//! voters is kept too.

use super::tests::{behind, installed, run, snapshot_of, versions};
use super::*;
use crate::core::{ClusterPlan, Command, CommandResult, Member, PlanChange, PLANS};

fn formed() -> ClusterPlan {
    let members =
        (0..3).map(|n| (n, Member { addr: format!("10.0.0.{n}:26502"), region: "r".into(), zone: format!("z{n}") }));
    ClusterPlan::initial(members.collect(), vec![vec![0, 1, 2]; 2], 3)
}

#[tokio::test]
async fn a_plan_is_snapshotted_at_version_15_installed_and_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, shared) = behind(dir.path(), PLANS - 1).await;
    let member = Member { addr: "10.0.0.3:26502".into(), region: "r".into(), zone: "z3".into() };
    let change =
        Command::ChangePlan { initial: Box::new(formed()), epoch: None, change: PlanChange::AddNode { id: 3, member } };
    let CommandResult::Plan(Some(plan)) = run(&mut sm, 1, 1_000, change).await else { panic!("a plan") };
    assert_eq!((plan.epoch, plan.members.len()), (1, 4));
    let stale = Command::ChangePlan { initial: Box::new(formed()), epoch: Some(0), change: PlanChange::Pause };
    let CommandResult::Rejected(refused) = run(&mut sm, 2, 1_000, stale).await else { panic!("refused") };
    assert!(refused.message.contains("epoch 1 now"), "{}", refused.message);
    let target = plan.target[0].clone();
    run(&mut sm, 3, 1_000, Command::ReportVoters { partition: 0, voters: target.clone() }).await;
    let plan = shared.plan().expect("a plan");
    assert_eq!((plan.epoch, &plan.current[0]), (2, &target), "the report is kept");
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(&bytes[..crate::codec::HEADER_LEN], crate::codec::header(PLANS), "a plan: version 15");
    let (store, follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    assert_eq!(follower_shared.plan().as_ref(), Some(&plan), "installed with the plan");
    drop((follower, follower_shared));
    let (_, reopened) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-f"), versions()).unwrap();
    assert_eq!(reopened.plan().as_ref(), Some(&plan), "and stored with it");
}

#[tokio::test]
async fn only_partition_0_keeps_a_plan() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::storage::Store::open(&dir.path().join("p1")).unwrap();
    let (mut sm, shared) = StateMachine::open(1, store, dir.path().join("snap"), versions()).unwrap();
    let change = Command::ChangePlan { initial: Box::new(formed()), epoch: None, change: PlanChange::Pause };
    let CommandResult::Rejected(refused) = run(&mut sm, 1, 1_000, change).await else { panic!("refused") };
    assert!(refused.message.contains("partition 0's"), "{}", refused.message);
    run(&mut sm, 2, 1_000, Command::ReportVoters { partition: 1, voters: vec![0] }).await;
    assert_eq!(shared.plan(), None);
}
