-- Enqueue a welcome email whenever a user is added, in the INSERT's own
-- transaction: the job exists if and only if the user row commits. The key
-- makes a second job for the same user impossible (a re-run of the INSERT in a
-- retried transaction, or a copy of the row, gives the first job's id).
CREATE TABLE app_user (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL
);

CREATE FUNCTION app_user_welcome() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rota.enqueue(
        'email.welcome',
        jsonb_build_object('user_id', NEW.id, 'email', NEW.email),
        key => 'welcome:' || NEW.id,
        priority => 3
    );
    RETURN NEW;
END
$$;

CREATE TRIGGER app_user_welcome AFTER INSERT ON app_user
    FOR EACH ROW EXECUTE FUNCTION app_user_welcome();
