//! Tests of validation: payload limits, tenants, labels, and the headers a create puts.

mod general {
    use super::super::*;
    use crate::core::ActivatedJobData;

    #[test]
    fn variables_must_be_an_object() {
        assert!(json_object("variables", "[1]".into()).is_err());
        assert!(json_object("variables", "{\"a\":".into()).is_err());
        assert_eq!(&json_object("variables", "".into()).unwrap()[..], b"{}");
        assert!(json_object("variables", " {\"a\": 1} ".into()).is_ok());
    }

    #[test]
    fn a_job_near_the_default_payload_limit_fits_every_message() {
        let limits = Limits::default();
        let variables = format!(r#"{{"blob":"{}"}}"#, "x".repeat(3_900_000));
        let request = pb::CreateJobRequest { r#type: "t".into(), variables, ..Default::default() };
        let job = new_job(request, String::new(), &limits, &DedupeWindows::default(), || RequestId::Gateway {
            node: 0,
            epoch: 0,
            seq: 0,
        })
        .expect("a 3.9 MB job is accepted");
        assert!(job.spec.encoded_len() <= limits.max_request_bytes());
        // Activated for a worker whose name is as large as a request allows.
        let activated = ActivatedJobData::encoded_len(&job.spec, &"w".repeat(limits.max_request_bytes()));
        assert!(activated < limits.max_cluster_message_bytes(), "one activated job fits a cluster message");
    }

    #[test]
    fn a_job_too_large_as_stored_is_refused() {
        let limits = Limits { max_payload_bytes: 1 << 20, ..Limits::default() };
        // 150k tiny headers: under the payload limit, over it as stored.
        let custom_headers = (0..150_000).map(|n| (format!("{n:x}"), String::new())).collect();
        let request = pb::CreateJobRequest { r#type: "t".into(), custom_headers, ..Default::default() };
        let error = new_job(request, String::new(), &limits, &DedupeWindows::default(), || RequestId::Gateway {
            node: 0,
            epoch: 0,
            seq: 0,
        })
        .unwrap_err();
        assert!(matches!(&error, ApiError::ResourceExhausted(m) if m.contains("as stored")), "{error:?}");
    }

    #[test]
    fn tenants_are_a_set_with_a_default() {
        assert_eq!(tenants(vec![]).unwrap(), vec![DEFAULT_TENANT.to_string()]);
        assert_eq!(tenants(vec!["b".into(), "a".into(), "b".into()]).unwrap(), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn tenant_lists_and_ids_are_bounded() {
        let many = |n: usize| (0..n).map(|i| format!("t{i}")).collect::<Vec<_>>();
        assert_eq!(tenants(many(MAX_TENANTS_PER_WORKER)).unwrap().len(), MAX_TENANTS_PER_WORKER);
        assert!(matches!(tenants(many(MAX_TENANTS_PER_WORKER + 1)), Err(ApiError::InvalidArgument(_))));
        assert!(tenants(vec!["x".repeat(MAX_TENANT_LEN + 1)]).is_err());
        assert!(tenants(vec!["a\nb".into()]).is_err());
        assert_eq!(tenant_id("tenant_id", String::new()).unwrap(), DEFAULT_TENANT);
    }
}

mod labels {
    use super::super::*;

    #[test]
    fn labels_must_be_name_value_and_a_job_names_at_most_16() {
        let owned = |ls: &[&str]| ls.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        let error = routing(owned(&["region"]), vec![]).unwrap_err().to_string();
        assert!(error.contains("not name:value") && error.contains("required_labels"), "{error}");
        let many: Vec<String> = (0..17).map(|i| format!("pool:p{i}")).collect();
        let error = routing(many[..9].to_vec(), many[9..].to_vec()).unwrap_err().to_string();
        assert!(error.contains("at most 16"), "{error}");
        let ok = routing(owned(&["region:b", "region:b"]), owned(&["pool:gpu"])).unwrap();
        assert_eq!((ok.required, ok.preferred), (owned(&["region:b"]), owned(&["pool:gpu"])));
    }
}

mod timeouts {
    use super::super::*;

    fn created(activation_timeout: i64, header: Option<&str>) -> Result<NewJob, ApiError> {
        let custom_headers =
            header.map(|ms| (ACTIVATION_TIMEOUT_HEADER.to_string(), ms.to_string())).into_iter().collect();
        let request =
            pb::CreateJobRequest { r#type: "t".into(), custom_headers, activation_timeout, ..Default::default() };
        new_job(request, String::new(), &Limits::default(), &DedupeWindows::default(), || RequestId::Gateway {
            node: 0,
            epoch: 0,
            seq: 0,
        })
    }

    fn invalid(result: Result<NewJob, ApiError>) -> String {
        match result {
            Err(ApiError::InvalidArgument(message)) => message,
            other => panic!("INVALID_ARGUMENT expected, got {:?}", other.map(|job| job.spec)),
        }
    }

    #[test]
    fn a_creates_activation_timeout_is_the_jobs_header_and_a_header_alone_is_checked() {
        let timeout = |job: NewJob| crate::core::activation_timeout(&job.spec);
        assert_eq!(timeout(created(0, None).unwrap()), None);
        assert_eq!(timeout(created(90_000, None).unwrap()), Some(90_000));
        assert_eq!(timeout(created(0, Some("90000")).unwrap()), Some(90_000));
        assert_eq!(timeout(created(90_000, Some("90000")).unwrap()), Some(90_000), "the two agree");
        assert_eq!(timeout(created(MAX_ACTIVATION_TIMEOUT_MS, None).unwrap()), Some(MAX_ACTIVATION_TIMEOUT_MS));
    }

    #[test]
    fn an_expiry_is_put_and_checked_the_same_way() {
        let mut headers = Vec::new();
        expiry(&mut headers, 5_000).unwrap();
        assert_eq!(headers, vec![(EXPIRES_AT_HEADER.to_string(), "5000".to_string())]);
        expiry(&mut headers, 0).unwrap();
        expiry(&mut headers, 5_000).unwrap();
        let error = expiry(&mut headers, 6_000).unwrap_err().to_string();
        assert!(error.contains("disagree"), "{error}");
        let error = expiry(&mut Vec::new(), -1).unwrap_err().to_string();
        assert!(error.contains("expires_at must be 0 (none) or a Unix time in ms above 0"), "{error}");
        let mut bad = vec![(EXPIRES_AT_HEADER.to_string(), "soon".to_string())];
        let error = expiry(&mut bad, 0).unwrap_err().to_string();
        assert!(error.contains("is the job's expiry"), "{error}");
    }

    #[test]
    fn a_bad_or_disagreeing_activation_timeout_is_refused_saying_why() {
        assert!(invalid(created(5_000, Some("90000"))).contains("disagree"));
        for bad in [-1, MAX_ACTIVATION_TIMEOUT_MS + 1] {
            assert!(invalid(created(bad, None)).contains("activation_timeout must be"), "{bad}");
        }
        for bad in ["0", "-3", "ten", "99999999999"] {
            assert!(invalid(created(0, Some(bad))).contains(ACTIVATION_TIMEOUT_HEADER), "{bad:?}");
        }
    }
}
