# frozen_string_literal: true

# Required from the e2e puma.rb (PumaCluster's puma_rb_requires:) by spec/metrics_spec.rb: the
# master's hub serves GET /metrics on PGBUS_E2E_METRICS_PORT (0: any free port; its log names it).
require "pgbus/hub"
Pgbus::Hub.configure { |c| c.metrics_port = Integer(ENV.fetch("PGBUS_E2E_METRICS_PORT")) }
