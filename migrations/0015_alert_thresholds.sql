ALTER TABLE `accounts` ADD `operator_events` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `crons` ADD `notify_after_failures` integer DEFAULT 1 NOT NULL;--> statement-breakpoint
ALTER TABLE `disks` ADD `alert_at_percent` integer DEFAULT 90 NOT NULL;