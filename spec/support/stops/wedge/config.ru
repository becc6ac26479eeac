# frozen_string_literal: true

# spec/puma_stuck_close_spec.rb's app: PumaCluster's /pid and nothing else.
run ->(_env) { [200, { "content-type" => "application/json" }, [%({"pid":#{Process.pid}})]] }
