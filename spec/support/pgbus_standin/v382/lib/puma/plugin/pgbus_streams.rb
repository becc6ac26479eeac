# frozen_string_literal: true

# STAND-IN for pgbus 0.13.1's hub-aware lib/puma/plugin/pgbus_streams.rb
# (contract §4): boot MasterHubBoot in cluster mode, tear down on
# :after_stopped / :before_restart (keys Puma 5.6/6 never fire — as in pgbus).
# Like pgbus's, it does not require pgbus: MasterHubBoot is booted only if puma.rb
# (or something before it) already loaded pgbus when the plugin starts.
require "puma/plugin"

Puma::Plugin.create do
  def start(launcher)
    @launcher = launcher
    boot_master_hub(launcher)
    launcher.events.register(:after_stopped) { teardown_master_hub; teardown_streamer }
    launcher.events.register(:before_restart) { teardown_master_hub; teardown_streamer }
    writer = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
    writer.log("[Pgbus::Puma::Plugin] pgbus (#382) pgbus_streams plugin started")
  end

  private

  def boot_master_hub(launcher)
    return unless defined?(Pgbus::Web::Streamer::MasterHubBoot)
    return unless cluster_mode?(launcher)

    @master_hub_boot = Pgbus::Web::Streamer::MasterHubBoot.new.start
  rescue StandardError => e
    log_error(e)
  end

  def cluster_mode?(launcher)
    launcher.options[:workers].to_i.positive?
  rescue StandardError
    false
  end

  def teardown_master_hub
    @master_hub_boot&.stop
    @master_hub_boot = nil
  rescue StandardError => e
    log_error(e)
  end

  def teardown_streamer
    Pgbus::Web::Streamer.reset! if defined?(Pgbus::Web::Streamer)
  rescue StandardError => e
    log_error(e)
  end

  def log_error(error)
    message = "[Pgbus::Puma::Plugin] streamer teardown raised: #{error.class}: #{error.message}"
    @launcher.respond_to?(:log_writer) ? @launcher.log_writer.log(message) : @launcher.events.log(message)
  end
end
