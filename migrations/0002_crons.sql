CREATE TABLE `cron_runs` (
	`cron_id` text NOT NULL,
	`job_name` text NOT NULL,
	`trigger` text NOT NULL,
	`status` text NOT NULL,
	`scheduled_at` integer NOT NULL,
	`started_at` integer NOT NULL,
	`finished_at` integer,
	`exit_code` integer,
	`error` text,
	`builder_job_id` text,
	`log_key` text,
	PRIMARY KEY(`cron_id`, `job_name`),
	FOREIGN KEY (`cron_id`) REFERENCES `crons`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `cron_runs_started_idx` ON `cron_runs` (`cron_id`,`started_at`);--> statement-breakpoint
CREATE INDEX `cron_runs_running_idx` ON `cron_runs` (`status`);--> statement-breakpoint
CREATE TABLE `crons` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`app_id` text NOT NULL,
	`name` text NOT NULL,
	`schedule` text NOT NULL,
	`command` text NOT NULL,
	`timezone` text DEFAULT 'UTC' NOT NULL,
	`concurrency_policy` text DEFAULT 'forbid' NOT NULL,
	`timeout_seconds` integer DEFAULT 3600 NOT NULL,
	`enabled` integer DEFAULT true NOT NULL,
	`last_run_at` integer,
	`next_run_at` integer,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE UNIQUE INDEX `crons_account_name_idx` ON `crons` (`account_id`,`name`);--> statement-breakpoint
CREATE INDEX `crons_app_idx` ON `crons` (`app_id`);